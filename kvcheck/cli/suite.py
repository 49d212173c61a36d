"""The commands over the suite and its traces: run, replay, show, promote, export."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kvcheck.vllm_releases import semantics_in_force
from kvmodel.limits import (
    MAX_FULL_CHECK_EVERY,
    MAX_GROUPS,
    MAX_SEED,
    MAX_SWARM_RUNS,
)

if TYPE_CHECKING:
    pass
from kvcheck.cli.common import (
    EXIT_OK,
    EXIT_VIOLATION,
    bad_input,
    default_corpus,
    load_traces,
    out_of_range,
    suite_folder,
)

# -- run ------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    import pytest

    from kvcheck.summary import SuiteSummary

    refusal = out_of_range(
        [
            ("--groups", args.groups, 1, MAX_GROUPS),
            ("--swarm-runs", args.swarm_runs, 0, MAX_SWARM_RUNS),
            ("--full-check-every", args.full_check_every, 1, MAX_FULL_CHECK_EVERY),
            ("--seed", args.seed, 0, MAX_SEED),
        ]
    )
    if refusal is not None:
        return bad_input(refusal)
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


def cmd_replay(args: argparse.Namespace) -> int:
    from kvcheck.render import render
    from kvcheck.replay import replay, resolve_target
    from kvcheck.trace import Trace

    try:
        make_target = resolve_target(args.target, args.fault)
    except ValueError as exc:
        return bad_input(str(exc))
    loaded = load_traces(args.traces)
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
        return bad_input(str(exc))
    loaded = load_traces([args.trace])
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

    loaded = load_traces([args.trace])
    if isinstance(loaded, int):
        return loaded
    _, trace = loaded[0]
    corpus = Corpus(Path(args.corpus) if args.corpus else default_corpus())
    try:
        message = corpus.promote(trace, args.name, args.story, datetime.date.today().isoformat())
    except ValueError as exc:
        return bad_input(str(exc))
    print(message)
    return EXIT_OK


# -- export -----------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    from kvcheck.export import ExportError, default_output_name, export_trace
    from kvcheck.targets.vllm_target import VllmUnavailable
    from kvcheck.trace import Trace

    loaded = load_traces([args.trace])
    if isinstance(loaded, int):
        return loaded
    path, trace = loaded[0]
    assert isinstance(trace, Trace)
    output = Path(args.output) if args.output else Path(default_output_name(path))
    try:
        text = export_trace(trace, path, output.name)
    except VllmUnavailable as exc:
        return bad_input(f"{path}: cannot export: {exc}")
    except ExportError as exc:
        return bad_input(str(exc))
    try:
        output.write_text(text)
    except OSError as exc:
        return bad_input(f"{output}: cannot write the exported test: {exc.strerror or exc}")
    print(output)
    return EXIT_OK
