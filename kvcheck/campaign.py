"""``kvcheck campaign``: a long search split into shards run as Ray tasks, on one machine or a cluster.

A *shard* is a few seconds of one of the three searches, run by one Ray
task on one CPU:

- ``swarm``: the swarm driver (:mod:`kvcheck.swarm`) over a range of
  consecutive seeds, :data:`SWARM_RUNS_PER_SEED` runs each;
- ``machine``: the Hypothesis manager machine with a seed of its own
  (:data:`MACHINE_EXAMPLES_PER_SHARD` examples), every machine shard sharing
  one Hypothesis example database folder, so that a failing example one shard
  saved is replayed first by the shards after it;
- ``explore``: the exhaustive explorer (:mod:`kvcheck.explore`) on one
  configuration of the ``standard`` scope, at depth 4 for every
  configuration, then at depth 5.

The driver keeps every worker busy (one shard queued besides) until the time
budget is spent; a shard stops at the budget's end too (a machine shard
finishes its examples first), except the first shard of each kind, which runs
whole however short the budget, so that every campaign searches with each.
Each shard shrinks its own failures with :func:`kvcheck.shrink.shrink`; the
driver deduplicates them by invariant and shrunk operations, writes each
distinct one out with :func:`kvcheck.repro.write_repro` (at most
:data:`MAX_REPROS_PER_INVARIANT` per invariant), and reports each violated
invariant once, with its shortest repro.  Shards report their steps and
coverage labels once a second to a small Ray actor, which the driver reads for
its status line.

Ray is imported only by :func:`run_campaign`'s caller (``kvcheck campaign``),
so the rest of kvcheck works without it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import attrs

from kvcheck.targets import TargetFactory
from kvcheck.trace import Trace
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
PLAIN_STATUS_SECONDS = 10.0
"""How often a status line is printed when the output is not a terminal."""
OBJECT_STORE_BYTES = 128 * 1024 * 1024
"""The object store of an embedded Ray (shards pass a few kilobytes each)."""
WORKER_NICENESS = 0
"""The niceness of an embedded Ray's workers.  Ray's default, 15, lets any other busy process on the
machine take the workers' cores: with two busy processes on two cores, a 15 s campaign took three
minutes.  A campaign runs at the priority ``kvcheck run`` does; ``--workers`` bounds its cores."""
RAY_MISSING = "kvcheck campaign runs on Ray, which is not installed: pip install 'kvcheck[campaign]'"


# -- shards ---------------------------------------------------------------------------------------


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
    from kvcheck.coverage import LABELS_SEEN

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
    from kvcheck.coverage import LABELS_SEEN
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


# -- deduplication --------------------------------------------------------------------------------


MAX_REPROS_PER_INVARIANT = 20
"""Distinct failures of one invariant written out; further ones are counted only (a planted fault
shrinks to a new handful of operations every few runs, which a long campaign would write by the thousand)."""


@attrs.define
class DistinctFailure:
    """A distinct failure: an invariant and the shrunk operations that violate it, with its repro files."""

    invariant: str
    number: int
    """Its number among its invariant's distinct failures, from 1."""
    message: str
    trace: Trace
    found_by: str
    findings: int = 0
    json_path: Path | None = None
    py_path: Path | None = None

    @property
    def size(self) -> tuple[int, int]:
        """Steps first, then the operations' length as text: what makes a repro quicker to read."""
        return len(self.trace.ops), len(repr(self.trace.ops))


@attrs.define
class InvariantFailures:
    """The distinct failures of one invariant, and how often and by how many shards it was found."""

    invariant: str
    distinct: list[DistinctFailure] = attrs.Factory(list)
    shards: set[int] = attrs.Factory(set)
    findings: int = 0

    @property
    def written(self) -> list[DistinctFailure]:
        return [failure for failure in self.distinct if failure.json_path is not None]

    @property
    def shortest(self) -> DistinctFailure:
        """The smallest written repro (the first distinct failure when none is written yet)."""
        return min(self.written or self.distinct[:1], key=lambda failure: failure.size)


class FailureBook:
    """The failures of a campaign, deduplicated by invariant and shrunk operations, grouped by invariant.

    The shrinker stops at a local minimum, so runs that find one bug often shrink to different
    operations (one run's request is freed, another's preempted, a third's window slides); the
    summary therefore reports each violated invariant once, with its shortest repro, and lists the
    distinct traces under it."""

    def __init__(self) -> None:
        self.invariants: dict[str, InvariantFailures] = {}
        self._known: dict[tuple[str, tuple[object, ...]], DistinctFailure] = {}

    @property
    def distinct(self) -> int:
        return sum(len(group.distinct) for group in self.invariants.values())

    @property
    def findings(self) -> int:
        return sum(group.findings for group in self.invariants.values())

    def add(self, finding: Finding) -> DistinctFailure | None:
        """Record a finding; returns its distinct failure when it is a new one."""
        from kvcheck.trace import parse_trace

        group = self.invariants.setdefault(finding.invariant, InvariantFailures(finding.invariant))
        group.findings += finding.times
        group.shards.add(finding.shard)
        trace = parse_trace(finding.trace_text, finding.found_by)
        key = (finding.invariant, trace.ops)
        known = self._known.get(key)
        if known is not None:
            known.findings += finding.times
            return None
        failure = DistinctFailure(
            finding.invariant, len(group.distinct) + 1, finding.message, trace, finding.found_by, finding.times
        )
        group.distinct.append(failure)
        self._known[key] = failure
        return failure


# -- the driver -----------------------------------------------------------------------------------


@attrs.define
class KindTotals:
    shards: int = 0
    steps: int = 0
    runs: int = 0
    exhausted: int = 0
    cut_short: int = 0
    seconds: float = 0.0


@attrs.define
class CampaignReport:
    """What a campaign did and found."""

    target: str
    fault: str | None
    workers: int
    budget_seconds: float
    seed: int
    seconds: float = 0.0
    kinds: dict[str, KindTotals] = attrs.Factory(lambda: {kind: KindTotals() for kind in SHARD_KINDS})
    labels: Counter[str] = attrs.Factory(Counter)
    nodes: set[str] = attrs.Factory(set)
    failures: list[InvariantFailures] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    skipped: int = 0
    interrupted: bool = False
    database: str | None = None
    """The Hypothesis example database folder, when it is kept."""

    @property
    def shards(self) -> int:
        return sum(totals.shards for totals in self.kinds.values())

    @property
    def steps(self) -> int:
        return sum(totals.steps for totals in self.kinds.values())

    @property
    def findings(self) -> int:
        return sum(group.findings for group in self.failures)

    @property
    def distinct(self) -> int:
        return sum(len(group.distinct) for group in self.failures)

    @property
    def clean(self) -> bool:
        return not self.failures and not self.errors

    def absorb(self, result: ShardResult) -> None:
        """Count a finished shard (its findings are the failure book's)."""
        if result.skipped:
            self.skipped += 1
            return
        totals = self.kinds[result.spec.kind]
        totals.shards += 1
        totals.steps += result.steps
        totals.runs += result.runs
        totals.seconds += result.seconds
        if result.spec.kind == "explore" and result.error is None:
            if result.exhausted:
                totals.exhausted += 1
            elif not result.findings:
                totals.cut_short += 1
        self.labels.update(result.labels)
        if result.node:
            self.nodes.add(result.node)
        if result.error is not None:
            self.errors.append(result.error)


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Campaign:
    """Submits shards to Ray until the budget is spent, and keeps the status line and the failures."""

    def __init__(
        self,
        ray: Any,
        options: ShardOptions,
        *,
        workers: int,
        budget_seconds: float,
        seed: int,
        repros: Path,
        out: TextIO = sys.stdout,
    ) -> None:
        self.ray = ray
        self.options = options
        self.workers = workers
        self.budget = budget_seconds
        self.repros = repros
        self.out = out
        self.tty = out.isatty()
        self.book = FailureBook()
        self.report = CampaignReport(options.target, options.fault, workers, budget_seconds, seed)
        self.plan = shard_plan(seed, options.num_groups)
        self.in_flight: dict[Any, ShardSpec] = {}
        self.live: dict[int, tuple[int, dict[str, int]]] = {}
        self.started = 0.0
        self.last_status = 0.0
        self.status_width = 0

    def run(self) -> CampaignReport:
        ray = self.ray
        remote_shard = ray.remote(num_cpus=1, max_retries=1)(ray_shard)
        board = ray.remote(num_cpus=0)(ProgressBoard).remote()
        self.started = time.monotonic()
        end = self.started + self.budget
        self.options = attrs.evolve(self.options, deadline=time.time() + self.budget)
        capacity = self.workers + 1  # one queued, so that no worker waits for the driver
        try:
            while True:
                while time.monotonic() < end and len(self.in_flight) < capacity:
                    spec = next(self.plan)
                    # The first shard of each kind runs whole, however short the budget.
                    options = self.options if spec.number else attrs.evolve(self.options, deadline=float("inf"))
                    self.in_flight[remote_shard.remote(spec, options, board)] = spec
                if not self.in_flight:
                    break
                ready, _ = ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=0.25)
                for ref in ready:
                    self._finished(self._result(ref, self.in_flight.pop(ref)))
                self._status(board)
        except KeyboardInterrupt:
            self.report.interrupted = True
            for ref in self.in_flight:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
        self._status(board, final=True)
        self.report.seconds = time.monotonic() - self.started
        self.report.failures = list(self.book.invariants.values())
        return self.report

    def _result(self, ref: Any, spec: ShardSpec) -> ShardResult:
        try:
            result: ShardResult = self.ray.get(ref)
        except Exception as exc:  # the worker died (the shard itself returns its exceptions)
            return ShardResult(spec, error=f"{spec.describe()} failed as a Ray task: {type(exc).__name__}: {exc}")
        return result

    def _finished(self, result: ShardResult) -> None:
        self.report.absorb(result)
        self.live.pop(result.spec.key, None)
        for finding in result.findings:
            failure = self.book.add(finding)
            if failure is not None and failure.number <= MAX_REPROS_PER_INVARIANT:
                self._write(failure)
        if result.error is not None:
            self._say(f"shard error: {result.error.splitlines()[0]}")

    def _write(self, failure: DistinctFailure) -> None:
        from kvcheck.repro import write_repro

        stem = f"campaign-{failure.invariant}-{failure.number}"
        failure.json_path, failure.py_path = write_repro(failure.trace, self.repros, stem, self.options.target)
        if failure.number == 1:
            self._say(
                f"{failure.invariant} violated ({len(failure.trace.ops)} steps), found by {failure.found_by}: "
                f"{failure.json_path}"
            )

    def _say(self, line: str) -> None:
        """A line above the status line."""
        if self.tty and self.status_width:
            self.out.write("\r\x1b[K")
            self.status_width = 0
        self.out.write(line + "\n")
        self.out.flush()

    def _status(self, board: Any, final: bool = False) -> None:
        now = time.monotonic()
        interval = REPORT_SECONDS if self.tty else PLAIN_STATUS_SECONDS
        if not final and now - self.last_status < interval:
            return
        self.last_status = now
        keys = sorted(spec.key for spec in self.in_flight.values())
        if not final:
            with contextlib.suppress(Exception):  # a slow board only delays the live figures
                self.live = self.ray.get(board.snapshot.remote(keys), timeout=2.0)
        line = self.status_line(now, keys)
        if self.tty:
            self.out.write("\r\x1b[K" + line + ("\n" if final else ""))
            self.status_width = 0 if final else len(line)
        elif not final:
            self.out.write(line + "\n")
        self.out.flush()

    def status_line(self, now: float, running: list[int]) -> str:
        from kvcheck.coverage import ALL_LABELS

        elapsed = now - self.started
        live = {key: self.live[key] for key in running if key in self.live}
        steps = self.report.steps + sum(steps for steps, _ in live.values())
        labels = set(self.report.labels)
        for _, shard_labels in live.values():
            labels.update(shard_labels)
        left = self.budget - elapsed
        if left > 0:
            timing = f"{_clock(left)} left"
        else:
            timing = f"finishing {len(running)} shard{_s(len(running))}" if running else "budget spent"
        count = len(self.book.invariants)
        failures = str(count)
        if count:
            failures += f" invariant{_s(count)} ({self.book.distinct} traces, {self.book.findings} findings)"
        return (
            f"{_clock(elapsed)} elapsed, {timing} | shards {self.report.shards} done, {len(running)} running | "
            f"{steps:,} steps, {steps / max(elapsed, 1e-9):,.0f} steps/s | "
            f"labels {len(labels & set(ALL_LABELS))}/{len(ALL_LABELS)} | failures {failures}"
        )


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def summary_lines(report: CampaignReport) -> list[str]:
    """The campaign's summary, as ``kvcheck run`` ends with its own."""
    from kvcheck.coverage import ALL_LABELS

    under = f" with fault {report.fault}" if report.fault else ""
    nodes = f" on {len(report.nodes)} node{_s(len(report.nodes))}" if report.nodes else ""
    out = [
        "",
        f"kvcheck campaign summary: target {report.target}{under}, {report.workers} workers{nodes}, "
        f"budget {report.budget_seconds / 60:g} min, seed {report.seed}",
    ]
    by_kind = ", ".join(f"{kind} {totals.shards}" for kind, totals in report.kinds.items())
    out.append(f"  shards: {report.shards} ({by_kind})")
    units = {"swarm": "runs", "machine": "examples", "explore": "operations checked"}
    for kind, totals in report.kinds.items():
        line = f"    {kind:<8} {totals.shards:>5} shards  {totals.steps:>12,} steps  {totals.runs:>10,} {units[kind]}"
        if kind == "explore" and totals.shards:
            line += (
                f"; {totals.exhausted} configuration{_s(totals.exhausted)} exhausted, "
                f"{totals.cut_short} cut short by the budget"
            )
        out.append(line)
    seconds = max(report.seconds, 1e-9)
    out.append(f"  lockstep steps driven: {report.steps:,} in {report.seconds:.1f}s ({report.steps / seconds:,.0f}/s)")
    reached = [label for label in ALL_LABELS if report.labels[label]]
    out.append(f"  coverage labels reached (machine shards): {len(reached)}/{len(ALL_LABELS)}")
    for label in ALL_LABELS:
        out.append(f"    {'x' if report.labels[label] else ' '} {label} ({report.labels[label]})")
    if report.database:
        out.append(f"  Hypothesis example database: {report.database}")
    flag = f" --fault {report.fault}" if report.fault else ""
    for group in report.failures:
        shortest = group.shortest
        traces = len(group.distinct)
        out.append(
            f"  {group.invariant} violated: {group.findings} finding{_s(group.findings)} by {len(group.shards)} "
            f"shard{_s(len(group.shards))}, {traces} distinct shrunk trace{_s(traces)}"
        )
        out.append(f"    {shortest.message}".replace("\n", "\n    "))
        out.append(
            f"    shortest repro ({len(shortest.trace.ops)} steps): {shortest.json_path}; test: {shortest.py_path}"
        )
        out.append(f"    replay: kvcheck replay {shortest.json_path}{flag}")
        if traces > 1:
            out.append("    every distinct trace:")
            for failure in group.written:
                out.append(
                    f"      {failure.json_path} ({len(failure.trace.ops)} steps, found {failure.findings} "
                    f"time{_s(failure.findings)}, first by {failure.found_by})"
                )
            unwritten = traces - len(group.written)
            if unwritten:
                out.append(
                    f"      and {unwritten} more, not written (at most {MAX_REPROS_PER_INVARIANT} per invariant)"
                )
    for error in report.errors:
        out.append("  shard error: " + error.replace("\n", "\n    "))
    if report.interrupted:
        out.append("  interrupted: the shards still running were cancelled")
    if report.clean:
        verdict = "every invariant held"
    else:
        parts = []
        if report.failures:
            count = len(report.failures)
            parts.append(
                f"{count} invariant{_s(count)} violated ({report.distinct} distinct shrunk trace{_s(report.distinct)}, "
                f"{report.findings} finding{_s(report.findings)})"
            )
        if report.errors:
            parts.append(f"{len(report.errors)} shard error{_s(len(report.errors))}")
        verdict = ", ".join(parts)
    out.append(f"  verdict: {verdict}")
    return out


# -- Ray ------------------------------------------------------------------------------------------


def import_ray() -> Any:
    """Ray, or ``None`` when it is not installed."""
    try:
        import ray
    except ImportError:
        return None
    return ray


def default_workers() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def ray_session(ray: Any, address: str | None, workers: int | None) -> Iterator[int]:
    """Ray started on this machine (``num_cpus`` the workers), or joined at ``address``; yields the
    number of workers (by default the CPUs available: this machine's, or the cluster's)."""
    if ray.is_initialized():
        yield workers or int(ray.cluster_resources().get("CPU", 1))
        return
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address:
        ray.init(address=address, **quiet)
    else:
        workers = workers or default_workers()
        ray.init(
            num_cpus=workers,
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            _system_config={"worker_niceness": WORKER_NICENESS},
            **quiet,
        )
    try:
        yield workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    finally:
        ray.shutdown()


def run_campaign(
    ray: Any,
    *,
    minutes: float,
    address: str | None = None,
    workers: int | None = None,
    target: str = "kvcore",
    fault: str | None = None,
    num_groups: int | None = None,
    seed: int = 0,
    repros: Path = Path("repros"),
    database: Path | None = None,
    full_check_every: int = 1,
    out: TextIO = sys.stdout,
) -> CampaignReport:
    """Run a campaign of ``minutes`` on Ray (the module, imported by the caller) and print its
    status line; the summary is :func:`summary_lines`.  ``database`` keeps the machine shards'
    Hypothesis example database (by default a temporary folder, removed afterwards)."""
    from kvcheck.replay import resolve_target

    resolve_target(target, fault)  # an unknown target or fault raises ValueError before Ray starts
    folder = str(database.resolve()) if database else tempfile.mkdtemp(prefix="kvcheck-campaign-db-")
    try:
        with ray_session(ray, address, workers) as count:
            nodes = [node for node in ray.nodes() if node.get("Alive")]
            under = f", fault {fault}" if fault else ""
            out.write(
                f"kvcheck campaign: target {target}{under}, {minutes:g} min on {count} workers "
                f"({len(nodes)} node{_s(len(nodes))}), repros to {repros}\n"
            )
            out.flush()
            options = ShardOptions(target, fault, num_groups, folder, full_check_every=full_check_every)
            campaign = Campaign(
                ray,
                options,
                workers=count,
                budget_seconds=minutes * 60,
                seed=seed,
                repros=repros,
                out=out,
            )
            report = campaign.run()
    finally:
        if database is None:
            shutil.rmtree(folder, ignore_errors=True)
    report.database = str(database) if database else None
    return report
