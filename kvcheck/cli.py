"""The kvcheck command: run the suite, replay and show traces, promote them, run the kill matrix, explore,
run campaigns on Ray, export traces as vLLM-only tests.

Exit codes: 0 success, 1 an invariant was violated (or a fault survived),
2 bad input (a malformed trace, an unknown target or fault, a value above its
limit in :mod:`kvmodel.limits`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcheck.vllm_releases import semantics_in_force
from kvmodel.limits import (
    MAX_FULL_CHECK_EVERY,
    MAX_GROUPS,
    MAX_KILL_MATRIX_SEEDS,
    MAX_SEED,
    MAX_SWARM_RUNS,
    above,
)

if TYPE_CHECKING:
    from kvcheck.trace import Trace

EXIT_OK, EXIT_VIOLATION, EXIT_BAD_INPUT = 0, 1, 2

TARGET_HELP = (
    "allocator to drive: 'kvcore' (default), 'vllm', 'package.module:factory', "
    "or several of those joined by '+' (e.g. 'kvcore+vllm'), compared step by step"
)


def suite_folder(package: str) -> Path:
    """The folder of one of the suite's packages (``kvcheck.stateful_tests``, ``kvcheck.regressions``):
    in a checkout, the repository's top-level folder; installed, the one inside the kvcheck package."""
    import importlib

    module = importlib.import_module(package)
    assert module.__file__ is not None
    return Path(module.__file__).parent


def default_corpus() -> Path:
    """The regression corpus kvcheck ships (``regressions/traces`` in a checkout)."""
    return suite_folder("kvcheck.regressions") / "traces"


def _bad_input(message: str) -> int:
    print(f"kvcheck: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _out_of_range(options: Sequence[tuple[str, int | None, int, int]]) -> str | None:
    """The refusal of the first (option, value, minimum, maximum) whose value is out of range, if any."""
    for option, value, minimum, maximum in options:
        if value is None:
            continue
        if value < minimum:
            return f"{option}: {value} is below the minimum of {minimum}"
        if value > maximum:
            return f"{option}: {above(value, maximum)}"
    return None


# -- run ------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    import pytest

    from kvcheck.summary import SuiteSummary

    refusal = _out_of_range(
        [
            ("--groups", args.groups, 1, MAX_GROUPS),
            ("--swarm-runs", args.swarm_runs, 0, MAX_SWARM_RUNS),
            ("--full-check-every", args.full_check_every, 1, MAX_FULL_CHECK_EVERY),
            ("--seed", args.seed, 0, MAX_SEED),
        ]
    )
    if refusal is not None:
        return _bad_input(refusal)
    pytest_args = [
        str(suite_folder("kvcheck.stateful_tests")),
        str(suite_folder("kvcheck.regressions")),
        "-q",
        "-p",
        "no:cacheprovider",
        # kvcheck is imported before pytest starts, so pytest cannot rewrite the plugin's asserts.
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        f"--kvcheck-target={args.target}",
        f"--kvcheck-repros={Path('repros').resolve()}",
    ]
    if args.fault:
        pytest_args.append(f"--kvcheck-fault={args.fault}")
    if args.groups:
        pytest_args.append(f"--kvcheck-groups={args.groups}")
    if args.profile:
        pytest_args.append(f"--hypothesis-profile={args.profile}")
    summary = SuiteSummary(args.target, args.fault, args.groups)
    code = pytest.main(pytest_args, plugins=[summary])
    for line in summary.lines():
        print(line)
    swarm_ok = _run_swarm(args) if args.swarm_runs else True
    return EXIT_OK if code == 0 and swarm_ok else EXIT_VIOLATION


def _run_swarm(args: argparse.Namespace) -> bool:
    """The swarm driver over the same operations, model and invariants; a failure is shrunk and written out."""
    from kvcheck.replay import resolve_target
    from kvcheck.repro import failing_trace, write_repro
    from kvcheck.shrink import shrink
    from kvcheck.swarm import swarm

    make_target = resolve_target(args.target, args.fault)
    report = swarm(
        make_target,
        seed=args.seed,
        max_runs=args.swarm_runs,
        num_groups=args.groups,
        full_check_every=args.full_check_every,
    )
    every = "every step" if args.full_check_every == 1 else f"every {args.full_check_every} steps"
    print(
        f"  swarm driver: {report.runs:,} runs, {report.steps:,} steps in {report.seconds:.1f}s "
        f"({report.steps / max(report.seconds, 1e-9):,.0f} steps/s, seed {args.seed}, state checked in full {every})"
    )
    if report.failure is None:
        print("  swarm verdict: " + semantics_in_force().qualify("every invariant held"))
        return True
    small = shrink(make_target, report.failure)
    trace = failing_trace(small.config, list(small.ops), small.violation, args.fault, "kvcheck run swarm driver")
    json_path, py_path = write_repro(trace, Path("repros"), f"swarm-{small.violation.invariant}", args.target)
    flag = f" --fault {args.fault}" if args.fault else ""
    print(f"  swarm verdict: {semantics_in_force().qualify(str(small.violation))}".replace("\n", "\n  "))
    print(f"  shrunk trace ({len(small.ops)} steps): {json_path}; standalone test: {py_path}")
    print(f"  replay: kvcheck replay {json_path}{flag}")
    return False


# -- replay and show -------------------------------------------------------------


def _load(paths: Sequence[str]) -> list[tuple[str, Trace]] | int:
    from kvcheck.trace import TraceError, load_trace

    traces = []
    for path in paths:
        try:
            traces.append((path, load_trace(path)))
        except TraceError as exc:
            return _bad_input(str(exc))
    return traces


def cmd_replay(args: argparse.Namespace) -> int:
    from kvcheck.render import render
    from kvcheck.replay import replay, resolve_target
    from kvcheck.trace import Trace

    try:
        make_target = resolve_target(args.target, args.fault)
    except ValueError as exc:
        return _bad_input(str(exc))
    loaded = _load(args.traces)
    if isinstance(loaded, int):
        return loaded
    worst = EXIT_OK
    semantics = semantics_in_force()
    for path, trace in loaded:
        assert isinstance(trace, Trace)
        outcome = replay(trace, make_target)
        if outcome.violation is None:
            print(semantics.qualify(f"{path}: {outcome.steps_run} steps, every invariant held"))
            continue
        worst = EXIT_VIOLATION
        print(semantics.qualify(f"{path}: FAILED at step {outcome.violation.step} of {len(trace.ops)}"))
        print(f"  {outcome.violation}".replace("\n", "\n  "))
        last = outcome.checks[-1] if outcome.checks else None
        if last is not None:
            print("  state after the failing step (target):")
            for line in list(render(type(outcome)([last]), ""))[2:-2]:
                print("  " + line)
    return worst


def cmd_show(args: argparse.Namespace) -> int:
    from kvcheck.render import render
    from kvcheck.replay import replay, resolve_target
    from kvcheck.trace import Trace

    try:
        make_target = resolve_target(args.target, args.fault)
    except ValueError as exc:
        return _bad_input(str(exc))
    loaded = _load([args.trace])
    if isinstance(loaded, int):
        return loaded
    path, trace = loaded[0]
    assert isinstance(trace, Trace)
    outcome = replay(trace, make_target)
    title = f"{path}: {trace.config.describe()}"
    if trace.provenance:
        title += f"\n{trace.provenance.source}: {trace.provenance.story}"
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    for line in render(outcome, title, color=color):
        print(line)
    return EXIT_OK if outcome.violation is None else EXIT_VIOLATION


# -- promote ----------------------------------------------------------------------


def cmd_promote(args: argparse.Namespace) -> int:
    from kvcheck.corpus import Corpus

    loaded = _load([args.trace])
    if isinstance(loaded, int):
        return loaded
    _, trace = loaded[0]
    corpus = Corpus(Path(args.corpus) if args.corpus else default_corpus())
    try:
        message = corpus.promote(trace, args.name, args.story, datetime.date.today().isoformat())
    except ValueError as exc:
        return _bad_input(str(exc))
    print(message)
    return EXIT_OK


# -- faults and the kill matrix ---------------------------------------------------


def cmd_faults(args: argparse.Namespace) -> int:
    from kvcheck.faults import FAULTS

    width = max(map(len, FAULTS))
    for name, fault in FAULTS.items():
        print(f"{name:<{width}}  {fault.description}")
    return EXIT_OK


def cmd_kill_matrix(args: argparse.Namespace) -> int:
    from kvcheck.faults import FAULTS, VLLM_FAULTS
    from kvcheck.kill_matrix import KillBudget, format_table, kill_matrix

    refusal = _out_of_range(
        [("--seeds", args.seeds, 1, MAX_KILL_MATRIX_SEEDS), ("--runs", args.runs, 1, MAX_SWARM_RUNS)]
    )
    if refusal is not None:
        return _bad_input(refusal)
    if args.target not in ("kvcore", "vllm"):
        return _bad_input(f"the kill matrix plants faults into kvcore or vllm; target {args.target!r} has none")
    catalogue = FAULTS
    if args.target == "vllm":
        from kvcheck.targets import load_target

        try:
            load_target("vllm")
        except ValueError as exc:
            return _bad_input(str(exc))
        catalogue = VLLM_FAULTS
    names = args.faults.split(",") if args.faults else list(catalogue)
    unknown = [n for n in names if n not in catalogue]
    if unknown:
        return _bad_input(f"unknown fault(s) {', '.join(unknown)}; see `kvcheck faults`")
    budget = KillBudget(seeds=tuple(range(args.seeds)), runs_per_seed=args.runs)
    results = kill_matrix(names, budget, Path(args.traces), target=args.target)
    for line in format_table(results):
        print(line)
    Path(args.json).write_text(json.dumps([r.to_json() for r in results], indent=2) + "\n")
    print(f"\nJSON: {args.json}; shrunk traces: {args.traces}/")
    survivors = [r.fault for r in results if not r.killed]
    if survivors:
        print(f"NOT KILLED: {', '.join(survivors)}")
        return EXIT_VIOLATION
    return EXIT_OK


MAX_EXPLORE_DEPTH = 12
MAX_EXPLORE_BLOCKS = 32
MAX_EXPLORE_REQUESTS = 6
MAX_EXPLORE_ALPHABET = 4


def _int_list(text: str, option: str, minimum: int, maximum: int) -> tuple[int, ...] | str:
    """Comma-separated integers within [minimum, maximum], or the refusal naming the option and value."""
    try:
        values = tuple(int(item) for item in text.split(","))
    except ValueError:
        return f"{option}: expected comma-separated integers, got {text!r}"
    refusal = _out_of_range([(option, value, minimum, maximum) for value in values])
    return refusal if refusal is not None else values


def _explore_scope(args: argparse.Namespace) -> object:
    """The scope the options ask for (a named scope with overrides), or a refusal string."""
    import attrs

    from kvcheck.scopes import FEATURES, LAYOUTS, SCOPES

    if args.scope not in SCOPES:
        return f"--scope: unknown scope {args.scope!r} (known: {', '.join(SCOPES)})"
    refusal = _out_of_range(
        [
            ("--depth", args.depth, 1, MAX_EXPLORE_DEPTH),
            ("--blocks", args.blocks, 1, MAX_EXPLORE_BLOCKS),
            ("--max-requests", args.max_requests, 1, MAX_EXPLORE_REQUESTS),
            ("--alphabet", args.alphabet, 1, MAX_EXPLORE_ALPHABET),
            ("--reach", args.reach, 1, MAX_EXPLORE_BLOCKS),
        ]
    )
    if refusal is not None:
        return refusal
    scope = SCOPES[args.scope]
    changes: dict[str, Any] = {}
    for option, field in (
        ("depth", "depth"),
        ("max_requests", "max_requests"),
        ("alphabet", "alphabet"),
        ("reach", "reach"),
    ):
        if getattr(args, option) is not None:
            changes[field] = getattr(args, option)
    if args.blocks is not None:
        changes["num_blocks"] = args.blocks + 1
    for option, field, maximum in (
        ("block_sizes", "block_sizes", 4),
        ("schedule_sizes", "schedule_sizes", 8),
        ("prompt_lengths", "prompt_lengths", 16),
    ):
        text = getattr(args, option)
        if text is not None:
            values = _int_list(text, "--" + option.replace("_", "-"), 1, maximum)
            if isinstance(values, str):
                return values
            changes[field] = values
    for option, field, known in (("layouts", "layouts", tuple(LAYOUTS)), ("features", "features", FEATURES)):
        text = getattr(args, option)
        if text is not None:
            names = tuple(text.split(","))
            unknown = [name for name in names if name not in known]
            if unknown:
                return f"--{option}: unknown {', '.join(map(repr, unknown))} (known: {', '.join(known)})"
            changes[field] = names
    if args.caching is not None:
        if args.caching not in ("on", "off", "both"):
            return f"--caching: expected on, off or both, got {args.caching!r}"
        changes["caching"] = {"on": (True,), "off": (False,), "both": (True, False)}[args.caching]
    return attrs.evolve(scope, **changes)


def cmd_explore(args: argparse.Namespace) -> int:
    from kvcheck.explore import explore
    from kvcheck.replay import resolve_target
    from kvcheck.repro import failing_trace, write_repro
    from kvcheck.scopes import Scope

    scope = _explore_scope(args)
    if isinstance(scope, str):
        return _bad_input(scope)
    assert isinstance(scope, Scope)
    try:
        make_target = resolve_target(args.target, args.fault)
    except ValueError as exc:
        return _bad_input(str(exc))
    fault = f", fault {args.fault}" if args.fault else ""
    print(f"kvcheck explore: target {args.target}{fault}, scope {args.scope}: {scope.describe()}")
    print(f"  {len(scope.configs())} configurations")

    def progress(stats: object) -> None:
        print(f"  depth {stats.depth}: {stats.explored:,} operations applied, {stats.frontier:,} new states")  # type: ignore[attr-defined]

    report = explore(make_target, scope, max_seconds=args.seconds, progress=progress)
    print(
        f"  {report.explored:,} states explored, {report.distinct:,} distinct, "
        f"{report.states_per_second:,.0f} states/s, {report.seconds:.1f} s"
    )
    if report.failure is not None:
        failure = report.failure
        violation = failure.violation
        print(f"shortest counterexample ({len(failure.ops)} steps), {failure.config.describe()}:")
        print(f"  {violation}".replace("\n", "\n  "))
        origin = f"kvcheck explore --scope {args.scope} on {args.target}"
        trace = failing_trace(failure.config, list(failure.ops), violation, args.fault, origin)
        json_path, py_path = write_repro(trace, Path(args.repros), f"explore-{violation.invariant}", args.target)
        print(f"  trace: {json_path}\n  test:  {py_path}")
        print(f"  replay: kvcheck replay {json_path}" + (f" --fault {args.fault}" if args.fault else ""))
        return EXIT_VIOLATION
    if not report.exhausted:
        reached = len(report.depths)
        print(f"stopped after {args.seconds} s at depth {reached}: the scope was not exhausted")
        return EXIT_OK
    print(f"scope exhausted at depth {scope.depth}: no violation")
    return EXIT_OK


# -- doctor -----------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print the installed vLLM, the semantics followed, the behaviour table on them, what is driven,
    and each known defect's standing on the installed release."""
    from kvcheck.known_defects import DEFECTS, defect_status
    from kvcheck.targets.vllm_target import VllmUnavailable, require_vllm
    from kvcheck.vllm_releases import installed_vllm
    from kvmodel.config import GROUP_KINDS
    from kvmodel.semantics import BEHAVIOURS, KNOWN_VERSIONS, NEWEST

    semantics = semantics_in_force()
    found = installed_vllm()
    print(f"kvcheck knows vLLM {', '.join(KNOWN_VERSIONS)}; kvcore follows {NEWEST}")
    print(f"installed: {'vLLM not installed' if found is None else f'vLLM {found[0]} at {found[1]}'}")
    print(f"semantics: {semantics.describe()}")
    print("behaviours (kvcheck/vllm_releases.py):")
    for row in BEHAVIOURS:
        mark = "x" if semantics.has(row.name) else " "
        source = row.sources.get(semantics.release, "absent")
        print(f"  [{mark}] {row.name} (since {row.since}; {source})")
    print(f"driven: every group kind ({', '.join(GROUP_KINDS)}) and feature, the same on every known release")
    try:
        require_vllm()
    except VllmUnavailable as exc:
        print(f"known defects: not checked ({exc})")
        return EXIT_OK
    print("known defects (kvcheck/known_defects.py), on the installed release:")
    confirmed = semantics.unconfirmed is None
    for defect in DEFECTS:
        print(f"  {defect.name}: {defect_status(defect, semantics.release, confirmed)}")
    return EXIT_OK


# -- drift ------------------------------------------------------------------------


def cmd_drift_record(args: argparse.Namespace) -> int:
    from kvcheck.drift import record
    from kvcheck.targets.vllm_target import VllmUnavailable, require_vllm
    from kvmodel.semantics import KNOWN_VERSIONS

    semantics = args.semantics or KNOWN_VERSIONS[0]
    refusal = _out_of_range([("--swarm-runs", args.swarm_runs, 0, MAX_SWARM_RUNS), ("--seed", args.seed, 0, MAX_SEED)])
    if refusal is not None:
        return _bad_input(refusal)
    if semantics not in KNOWN_VERSIONS:
        return _bad_input(f"--semantics: {semantics!r} is not a known vLLM release ({', '.join(KNOWN_VERSIONS)})")
    try:
        require_vllm()
    except VllmUnavailable as exc:
        return _bad_input(f"drift record: {exc}")
    document = record(default_corpus().glob("*.json"), args.seed, args.swarm_runs, semantics)
    output = Path(args.output)
    try:
        output.write_text(json.dumps(document) + "\n")
    except OSError as exc:
        return _bad_input(f"{output}: cannot write the drift file: {exc.strerror or exc}")
    steps = sum(len(run["steps"]) for run in document["runs"])
    print(f"{output}: vLLM {document['vllm']}, {len(document['runs'])} runs, {steps} steps, {semantics}'s calls")
    return EXIT_OK


def cmd_drift_compare(args: argparse.Namespace) -> int:
    from kvcheck.drift import DriftFileError, compare, read

    try:
        first, second = read(Path(args.first)), read(Path(args.second))
        drifts = compare(first, second)
    except DriftFileError as exc:
        return _bad_input(str(exc))
    versions = f"vLLM {first['vllm']} and vLLM {second['vllm']}"
    if not drifts:
        print(f"{versions}: {len(first['runs'])} runs alike, step by step, on {first['semantics']}'s calls")
        return EXIT_OK
    counts = f"{len(drifts)} of {len(first['runs'])} runs differ"
    print(f"{versions}: {counts} (each a row of kvcheck/vllm_releases.py or a finding):")
    for drift in drifts:
        print(f"  {drift}")
    return EXIT_VIOLATION


# -- export -----------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    from kvcheck.export import ExportError, default_output_name, export_trace
    from kvcheck.targets.vllm_target import VllmUnavailable
    from kvcheck.trace import Trace

    loaded = _load([args.trace])
    if isinstance(loaded, int):
        return loaded
    path, trace = loaded[0]
    assert isinstance(trace, Trace)
    output = Path(args.output) if args.output else Path(default_output_name(path))
    try:
        text = export_trace(trace, path, output.name)
    except VllmUnavailable as exc:
        return _bad_input(f"{path}: cannot export: {exc}")
    except ExportError as exc:
        return _bad_input(str(exc))
    try:
        output.write_text(text)
    except OSError as exc:
        return _bad_input(f"{output}: cannot write the exported test: {exc.strerror or exc}")
    print(output)
    return EXIT_OK


# -- campaign ---------------------------------------------------------------------


MAX_CAMPAIGN_WORKERS = 4096


def cmd_campaign(args: argparse.Namespace) -> int:
    import math

    from kvcheck.campaign import RAY_MISSING, import_ray, run_campaign, summary_lines
    from kvcheck.replay import resolve_target

    if not math.isfinite(args.minutes) or args.minutes <= 0:
        return _bad_input(f"--minutes: expected a number of minutes above 0, got {args.minutes}")
    refusal = _out_of_range(
        [
            ("--workers", args.workers, 1, MAX_CAMPAIGN_WORKERS),
            ("--groups", args.groups, 1, MAX_GROUPS),
            ("--seed", args.seed, 0, MAX_SEED),
            ("--full-check-every", args.full_check_every, 1, MAX_FULL_CHECK_EVERY),
        ]
    )
    if refusal is not None:
        return _bad_input(refusal)
    try:
        resolve_target(args.target, args.fault)
    except ValueError as exc:
        return _bad_input(str(exc))
    ray = import_ray()
    if ray is None:
        return _bad_input(RAY_MISSING)
    report = run_campaign(
        ray,
        minutes=args.minutes,
        address=args.address,
        workers=args.workers,
        target=args.target,
        fault=args.fault,
        num_groups=args.groups,
        seed=args.seed,
        repros=Path(args.repros),
        database=Path(args.database) if args.database else None,
        full_check_every=args.full_check_every,
    )
    for line in summary_lines(report):
        print(line)
    return EXIT_OK if report.clean else EXIT_VIOLATION


def build_parser() -> argparse.ArgumentParser:
    from kvcheck.scopes import FEATURES, LAYOUTS, SCOPES

    parser = argparse.ArgumentParser(prog="kvcheck", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def target_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--target", default="kvcore", help=TARGET_HELP)
        p.add_argument("--fault", default=None, help="plant a catalogued fault into kvcore (see `kvcheck faults`)")

    run = commands.add_parser("run", help="run the state machines and the regression corpus, with a summary")
    target_options(run)
    run.add_argument("--groups", type=int, default=None, help=f"fix the number of KV-cache groups (1 to {MAX_GROUPS})")
    run.add_argument("--profile", default=None, help="Hypothesis profile: dev, ci, thorough or smoke")
    run.add_argument(
        "--swarm-runs",
        type=int,
        default=2000,
        help=f"swarm driver runs after the machines (0: none; at most {MAX_SWARM_RUNS:,})",
    )
    run.add_argument("--seed", type=int, default=0, help=f"swarm driver seed (0 to {MAX_SEED})")
    run.add_argument(
        "--full-check-every",
        type=int,
        default=1,
        help=(
            "swarm driver: check the whole state every N steps and at the end of each run, only the step's "
            "results in between (and steps in flight); a violation is still reported exactly, by a replay "
            f"checked in full (default 1: every step; at most {MAX_FULL_CHECK_EVERY})"
        ),
    )
    run.set_defaults(func=cmd_run)

    rep = commands.add_parser("replay", help="replay traces, checking every invariant after every step")
    rep.add_argument("traces", nargs="+", metavar="TRACE")
    target_options(rep)
    rep.set_defaults(func=cmd_replay)

    show = commands.add_parser("show", help="render a trace step by step")
    show.add_argument("trace", metavar="TRACE")
    target_options(show)
    show.set_defaults(func=cmd_show)

    promote = commands.add_parser("promote", help="add a trace to the regression corpus")
    promote.add_argument("trace", metavar="FAILED_TRACE")
    promote.add_argument("--name", required=True, help="file name in the corpus (letters, digits, - and _)")
    promote.add_argument("--story", required=True, help="one line: what broke and why it matters")
    promote.add_argument(
        "--corpus",
        default=None,
        help="corpus folder (default: the shipped corpus, regressions/traces in a checkout)",
    )
    promote.set_defaults(func=cmd_promote)

    faults = commands.add_parser("faults", help="list the fault catalogue")
    faults.set_defaults(func=cmd_faults)

    matrix = commands.add_parser("kill-matrix", help="run every fault against the suite and tabulate the kills")
    matrix.add_argument("--target", default="kvcore", help="'kvcore' (default) or 'vllm'")
    matrix.add_argument("--faults", default=None, help="comma-separated subset of faults")
    matrix.add_argument(
        "--seeds", type=int, default=3, help=f"swarm seeds per fault (default 3, at most {MAX_KILL_MATRIX_SEEDS})"
    )
    matrix.add_argument(
        "--runs", type=int, default=3000, help=f"swarm runs per seed (default 3000, at most {MAX_SWARM_RUNS:,})"
    )
    matrix.add_argument("--json", default="kill-matrix.json", help="where to write the results as JSON")
    matrix.add_argument("--traces", default="repros/kill-matrix", help="where to write the shrunk traces")
    matrix.set_defaults(func=cmd_kill_matrix)

    explore = commands.add_parser(
        "explore", help="try every operation sequence of a small scope up to a depth, breadth first"
    )
    target_options(explore)
    explore.add_argument(
        "--scope", default="ci", help="named scope to start from: " + " or ".join(SCOPES) + " (default ci)"
    )
    explore.add_argument("--depth", type=int, default=None, help=f"operations per sequence (1 to {MAX_EXPLORE_DEPTH})")
    explore.add_argument("--blocks", type=int, default=None, help="usable blocks in the pool (besides the null block)")
    explore.add_argument("--block-sizes", default=None, help="comma-separated block sizes, e.g. 1,2")
    explore.add_argument("--layouts", default=None, help="comma-separated group layouts: " + ", ".join(LAYOUTS))
    explore.add_argument("--caching", default=None, help="on, off or both")
    explore.add_argument(
        "--features", default=None, help="comma-separated drafter/async features: " + ", ".join(FEATURES)
    )
    explore.add_argument("--alphabet", type=int, default=None, help="token ids in prompts (0 to N-1)")
    explore.add_argument("--reach", type=int, default=None, help="blocks a local group's window or chunk spans (2)")
    explore.add_argument("--prompt-lengths", default=None, help="comma-separated prompt lengths, e.g. 1,2,3")
    explore.add_argument("--max-requests", type=int, default=None, help="live requests at most")
    explore.add_argument("--schedule-sizes", default=None, help="comma-separated tokens per schedule, e.g. 1,2")
    explore.add_argument(
        "--seconds", type=float, default=None, help="stop after this long (the scope is then not exhausted)"
    )
    explore.add_argument("--repros", default="repros", help="where a counterexample's trace and test are written")
    explore.set_defaults(func=cmd_explore)

    campaign = commands.add_parser(
        "campaign", help="search for a time budget with swarm, machine and explorer shards run on Ray"
    )
    target_options(campaign)
    campaign.add_argument("--minutes", type=float, default=10.0, help="time budget in minutes (default 10)")
    campaign.add_argument(
        "--address", default=None, help="join the Ray cluster at this address (default: start Ray on this machine)"
    )
    campaign.add_argument(
        "--workers", type=int, default=None, help="shards run at once (default: the CPUs of this machine or cluster)"
    )
    campaign.add_argument(
        "--groups", type=int, default=None, help=f"fix the number of KV-cache groups (1 to {MAX_GROUPS})"
    )
    campaign.add_argument("--seed", type=int, default=0, help=f"first swarm and Hypothesis seed (0 to {MAX_SEED})")
    campaign.add_argument("--repros", default="repros", help="where each distinct failure's trace and test are written")
    campaign.add_argument(
        "--database",
        default=None,
        help="keep the machine shards' Hypothesis example database in this folder (default: a temporary one)",
    )
    campaign.add_argument(
        "--full-check-every",
        type=int,
        default=1,
        help=f"swarm shards check the whole state every N steps, as `kvcheck run` does (1 to {MAX_FULL_CHECK_EVERY})",
    )
    campaign.set_defaults(func=cmd_campaign)

    export = commands.add_parser(
        "export", help="write a trace as a standalone pytest file for vLLM (imports vLLM only, not kvcheck)"
    )
    export.add_argument("trace", metavar="TRACE")
    export.add_argument(
        "-o", "--output", default=None, help="where to write it (default: test_<trace stem>_vllm.py in this folder)"
    )
    export.set_defaults(func=cmd_export)

    doctor = commands.add_parser(
        "doctor",
        help="what vLLM is installed, which release's semantics kvcheck follows, and which known defects it shows",
    )
    doctor.set_defaults(func=cmd_doctor)

    drift = commands.add_parser(
        "drift", help="record the installed vLLM's outcomes on fixed runs, or diff two releases' recordings"
    )
    drift_commands = drift.add_subparsers(dest="drift_command", required=True)
    drift_record = drift_commands.add_parser(
        "record", help="drive the installed vLLM through the corpus and a fixed swarm"
    )
    drift_record.add_argument("output", metavar="FILE")
    drift_record.add_argument("--seed", type=int, default=0, help="the swarm's seed (default 0)")
    drift_record.add_argument(
        "--swarm-runs", type=int, default=200, help=f"swarm runs recorded besides the corpus (0 to {MAX_SWARM_RUNS})"
    )
    drift_record.add_argument(
        "--semantics",
        default=None,
        help="the release whose scheduler calls drive every release (default: the oldest kvcheck knows)",
    )
    drift_record.set_defaults(func=cmd_drift_record)
    drift_compare = drift_commands.add_parser("compare", help="each run's first step that differs between two files")
    drift_compare.add_argument("first", metavar="FILE")
    drift_compare.add_argument("second", metavar="FILE")
    drift_compare.set_defaults(func=cmd_drift_compare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
