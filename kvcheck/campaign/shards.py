"""Shards: a few seconds of one search (swarm, machine or explorer), run by one Ray task on one CPU,
and what each reports back."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import attrs

from kvcheck.targets import TargetFactory
from kvmodel.config import TargetConfig

SHARD_KINDS = ("swarm", "machine", "explore")
"""The kinds of shard, in the order the driver submits them (round robin)."""
SWARM_SEEDS_PER_SHARD = 6
SWARM_RUNS_PER_SEED = 100
"""A swarm shard: 6 seeds of 100 runs, some 600 runs of 40 steps (about 3 s on one core)."""
MACHINE_EXAMPLES_PER_SHARD = 200
"""A machine shard: 200 examples of the ``dev`` profile's 40 steps (about 3 s on one core)."""
MACHINE_LAYOUTS: tuple[int | None, ...] = (None, 2, 3, 4)
"""Group counts machine shards take in turn, as ``kvcheck run`` does (None: drawn from 1 to 4)."""
EXPLORE_SCOPE = "standard"
EXPLORE_DEPTHS = (4, 5)
"""Explorer shards: every configuration of the ``standard`` scope at depth 4 (0.3 to 9 s each on one
core), then at depth 5; the explorer kind then drops out of the rotation."""


REPORT_SECONDS = 1.0
"""How often a shard reports its progress, and how often the status line is redrawn on a terminal."""


@attrs.frozen
class ShardSpec:
    """One shard: its kind, its number among shards of that kind, and what it searches."""

    key: int
    """The shard's submission number, unique in the campaign."""
    kind: str
    number: int
    seed: int = 0
    """A swarm shard's first seed, or a machine shard's Hypothesis seed."""
    num_groups: int | None = None
    cell: tuple[int, str, bool, str] | None = None
    """An explorer shard's configuration: block size, layout, caching and feature."""
    depth: int = 0

    def describe(self) -> str:
        if self.kind == "swarm":
            return f"swarm shard {self.number} (seeds {self.seed}-{self.seed + SWARM_SEEDS_PER_SHARD - 1})"
        if self.kind == "machine":
            groups = "1 to 4" if self.num_groups is None else str(self.num_groups)
            return f"machine shard {self.number} (seed {self.seed}, groups {groups})"
        assert self.cell is not None
        block_size, layout, caching, feature = self.cell
        return (
            f"explore shard {self.number} (scope {EXPLORE_SCOPE}, block size {block_size}, {layout}, "
            f"caching {'on' if caching else 'off'}, {feature}, depth {self.depth})"
        )


@attrs.frozen
class ShardOptions:
    """What every shard of a campaign shares."""

    target: str = "kvcore"
    fault: str | None = None
    num_groups: int | None = None
    database: str = ""
    """The Hypothesis example database folder of the machine shards."""
    full_check_every: int = 1
    """Swarm shards check the whole state every this many steps (:func:`kvcheck.swarm.swarm`)."""
    deadline: float = float("inf")
    """The end of the time budget, in seconds since the epoch (``time.time()``)."""


@attrs.define
class Finding:
    """A failure a shard found and shrank: its invariant, its message and its trace as JSON text."""

    invariant: str
    message: str
    trace_text: str
    found_by: str
    """The shard (and the swarm seed) that found it."""
    shard: int
    """The shard's key."""
    times: int = 1


@attrs.define
class ShardResult:
    """What a shard did: lockstep steps driven (shrinking left out), runs, labels reached, findings."""

    spec: ShardSpec
    steps: int = 0
    seconds: float = 0.0
    runs: int = 0
    """Swarm runs, machine examples, or explorer operations applied."""
    labels: dict[str, int] = attrs.Factory(dict)
    findings: list[Finding] = attrs.Factory(list)
    exhausted: bool = False
    """An explorer shard explored its configuration to its depth."""
    skipped: bool = False
    """The shard started after the budget's end and did nothing."""
    node: str = ""
    error: str | None = None


def explore_cells(num_groups: int | None = None) -> list[tuple[int, str, bool, str]]:
    """The configurations of the explorer's scope, one per shard (only those of ``num_groups`` groups)."""
    from kvcheck.scopes import LAYOUTS, SCOPES

    scope = SCOPES[EXPLORE_SCOPE]
    cells = []
    for cell in itertools.product(scope.block_sizes, scope.layouts, scope.caching, scope.features):
        if num_groups is not None and len(LAYOUTS[cell[1]]) != num_groups:
            continue
        if _cell_scope(cell, scope.depth).configs():
            cells.append(cell)
    return cells


def _cell_scope(cell: tuple[int, str, bool, str], depth: int) -> Any:
    from kvcheck.scopes import SCOPES

    block_size, layout, caching, feature = cell
    return attrs.evolve(
        SCOPES[EXPLORE_SCOPE],
        block_sizes=(block_size,),
        layouts=(layout,),
        caching=(caching,),
        features=(feature,),
        depth=depth,
    )


def shard_plan(seed: int = 0, num_groups: int | None = None) -> Iterator[ShardSpec]:
    """The campaign's shards in submission order: swarm, machine and explorer shards in turn (the
    explorer's while configurations remain), without end."""
    cells = [(depth, cell) for depth in EXPLORE_DEPTHS for cell in explore_cells(num_groups)]
    layouts = MACHINE_LAYOUTS if num_groups is None else (num_groups,)
    counts: Counter[str] = Counter()
    key = 0
    while True:
        for kind in SHARD_KINDS:
            number = counts[kind]
            if kind == "swarm":
                spec = ShardSpec(key, kind, number, seed=seed + number * SWARM_SEEDS_PER_SHARD, num_groups=num_groups)
            elif kind == "machine":
                spec = ShardSpec(key, kind, number, seed=seed + number, num_groups=layouts[number % len(layouts)])
            elif number < len(cells):
                depth, cell = cells[number]
                spec = ShardSpec(key, kind, number, num_groups=num_groups, cell=cell, depth=depth)
            else:
                continue
            counts[kind] += 1
            key += 1
            yield spec


class _Meter:
    """Lockstep steps driven since the shard started, shrinking left out."""

    def __init__(self) -> None:
        from kvcheck.lockstep import Lockstep

        self._lockstep = Lockstep
        self._start = Lockstep.total_steps
        self._uncounted = 0

    @property
    def steps(self) -> int:
        return self._lockstep.total_steps - self._start - self._uncounted

    @contextlib.contextmanager
    def uncounted(self) -> Iterator[None]:
        before = self._lockstep.total_steps
        try:
            yield
        finally:
            self._uncounted += self._lockstep.total_steps - before


def _labels_now() -> dict[str, int]:
    from kvcheck.coverage.tally import LABELS_SEEN

    for _ in range(3):
        with contextlib.suppress(RuntimeError):  # the shard's thread added a label meanwhile
            return dict(LABELS_SEEN)
    return {}


class _Reporter:
    """A thread sending the shard's steps and labels to the campaign's progress board once a second."""

    def __init__(self, board: Any, key: int, meter: _Meter) -> None:
        self.board = board
        self.key = key
        self.meter = meter
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvcheck-campaign-reporter", daemon=True)

    def __enter__(self) -> _Reporter:
        if self.board is not None:
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(REPORT_SECONDS):
            with contextlib.suppress(Exception):  # progress is best effort; the result carries the totals
                self.board.report.remote(self.key, self.meter.steps, _labels_now())


class _Findings:
    """A shard's findings, shrunk, one per invariant and operations."""

    def __init__(self, make_target: TargetFactory, spec: ShardSpec, options: ShardOptions, meter: _Meter) -> None:
        self.make_target = make_target
        self.spec = spec
        self.options = options
        self.meter = meter
        self.found: dict[tuple[str, tuple[object, ...]], Finding] = {}

    def add(self, failure: Any, found_by: str) -> None:
        from kvcheck.repro import failing_trace
        from kvcheck.shrink import shrink

        with self.meter.uncounted():
            small = shrink(self.make_target, failure)
        key = (small.violation.invariant, small.ops)
        if key in self.found:
            self.found[key].times += 1
            return
        origin = f"kvcheck campaign, {found_by}"
        trace = failing_trace(small.config, list(small.ops), small.violation, self.options.fault, origin)
        self.found[key] = Finding(
            small.violation.invariant, str(small.violation), trace.dumps(), found_by, self.spec.key
        )


def run_shard(spec: ShardSpec, options: ShardOptions, board: Any = None) -> ShardResult:
    """Run one shard in this process; ``board`` (a progress actor, or None) hears from it once a second.

    Every exception is caught and returned as the result's ``error``, so a shard never fails as a task."""
    from kvcheck.coverage.tally import LABELS_SEEN
    from kvcheck.replay import resolve_target

    result = ShardResult(spec)
    started = time.perf_counter()
    if time.time() >= options.deadline:
        result.skipped = True
        return result
    LABELS_SEEN.clear()
    meter = _Meter()
    try:
        make_target = resolve_target(options.target, options.fault)
        findings = _Findings(make_target, spec, options, meter)
        with _Reporter(board, spec.key, meter):
            if spec.kind == "swarm":
                _swarm_shard(spec, options, make_target, findings, result)
            elif spec.kind == "machine":
                _machine_shard(spec, options, make_target, findings, result, meter)
            else:
                _explore_shard(spec, options, make_target, findings, result)
        result.findings = list(findings.found.values())
    except Exception:
        result.error = f"{spec.describe()} raised:\n{traceback.format_exc()}"
    result.steps = meter.steps
    result.labels = _labels_now()
    result.seconds = time.perf_counter() - started
    return result


def _swarm_shard(
    spec: ShardSpec, options: ShardOptions, make_target: TargetFactory, findings: _Findings, result: ShardResult
) -> None:
    from kvcheck.swarm import swarm

    for seed in range(spec.seed, spec.seed + SWARM_SEEDS_PER_SHARD):
        left = options.deadline - time.time()
        if left <= 0:
            return
        report = swarm(
            make_target,
            seed=seed,
            max_runs=SWARM_RUNS_PER_SEED,
            max_seconds=left,
            num_groups=spec.num_groups,
            full_check_every=options.full_check_every,
        )
        result.runs += report.runs
        if report.failure is not None:
            findings.add(report.failure, f"{spec.describe()}, seed {seed}")


def _machine_shard(
    spec: ShardSpec,
    options: ShardOptions,
    make_target: TargetFactory,
    findings: _Findings,
    result: ShardResult,
    meter: _Meter,
) -> None:
    from hypothesis import seed as fixed_seed
    from hypothesis import settings
    from hypothesis.database import DirectoryBasedExampleDatabase
    from hypothesis.stateful import run_state_machine_as_test

    from kvcheck.lockstep import Lockstep
    from kvcheck.profiles import PROFILES, SEARCH_PHASES, pin_generation_constants
    from kvcheck.stateful_tests.manager_machine import manager_machine
    from kvcheck.swarm import Failure
    from kvmodel.invariants import InvariantViolation

    pin_generation_constants()

    def counting_target(config: TargetConfig) -> Any:
        result.runs += 1
        return make_target(config)

    search = settings(
        PROFILES["dev"],
        max_examples=MACHINE_EXAMPLES_PER_SHARD,
        phases=SEARCH_PHASES,
        report_multiple_bugs=False,
        derandomize=False,
        database=DirectoryBasedExampleDatabase(options.database),
        print_blob=False,
    )
    machine = fixed_seed(spec.seed)(manager_machine(counting_target, spec.num_groups))
    try:
        run_state_machine_as_test(machine, settings=search)
    except InvariantViolation as violation:
        failing = Lockstep.latest
        if failing is None or len(failing.trace) < violation.step:
            raise
        found = Failure(failing.config, tuple(failing.trace[: violation.step]), violation)
        findings.add(found, spec.describe())


def _explore_shard(
    spec: ShardSpec, options: ShardOptions, make_target: TargetFactory, findings: _Findings, result: ShardResult
) -> None:
    from kvcheck.explore import explore

    assert spec.cell is not None
    report = explore(make_target, _cell_scope(spec.cell, spec.depth), max_seconds=options.deadline - time.time())
    result.runs = report.explored
    result.exhausted = report.exhausted
    if report.failure is not None:
        findings.add(report.failure, spec.describe())


def ray_shard(spec: ShardSpec, options: ShardOptions, board: Any) -> ShardResult:
    """:func:`run_shard` as a Ray task: also says which node it ran on."""
    import ray

    result = run_shard(spec, options, board)
    result.node = ray.get_runtime_context().get_node_id()
    return result


class ProgressBoard:
    """A Ray actor: the latest steps and labels each running shard reported."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[int, dict[str, int]]] = {}

    def report(self, key: int, steps: int, labels: dict[str, int]) -> None:
        self.live[key] = (steps, labels)

    def snapshot(self, keys: list[int]) -> dict[int, tuple[int, dict[str, int]]]:
        """The reports of the shards ``keys`` (those still running); the others' are dropped."""
        running = set(keys)
        self.live = {key: value for key, value in self.live.items() if key in running}
        return dict(self.live)
