"""The commands that search for faults and failures: faults, kill-matrix, explore, campaign."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvmodel.limits import (
    MAX_FULL_CHECK_EVERY,
    MAX_GROUPS,
    MAX_KILL_MATRIX_SEEDS,
    MAX_SEED,
    MAX_SWARM_RUNS,
)

if TYPE_CHECKING:
    pass
from kvcheck.cli.common import (
    EXIT_OK,
    EXIT_VIOLATION,
    bad_input,
    out_of_range,
)

# -- faults and the kill matrix ---------------------------------------------------


def cmd_faults(args: argparse.Namespace) -> int:
    from kvcheck.faults import FAULTS

    width = max(map(len, FAULTS))
    for name, fault in FAULTS.items():
        print(f"{name:<{width}}  {fault.description}")
    return EXIT_OK


def cmd_kill_matrix(args: argparse.Namespace) -> int:
    from kvcheck.faults import FAULTS
    from kvcheck.kill_matrix import KillBudget, format_table, kill_matrix

    refusal = out_of_range(
        [("--seeds", args.seeds, 1, MAX_KILL_MATRIX_SEEDS), ("--runs", args.runs, 1, MAX_SWARM_RUNS)]
    )
    if refusal is not None:
        return bad_input(refusal)
    if args.target not in ("kvcore", "vllm"):
        return bad_input(f"the kill matrix plants faults into kvcore or vllm; target {args.target!r} has none")
    catalogue = FAULTS
    if args.target == "vllm":
        from kvcheck.faults import VLLM_FAULTS
        from kvcheck.targets import load_target

        try:
            load_target("vllm")
        except ValueError as exc:
            return bad_input(str(exc))
        catalogue = VLLM_FAULTS
    names = args.faults.split(",") if args.faults else list(catalogue)
    unknown = [n for n in names if n not in catalogue]
    if unknown:
        return bad_input(f"unknown fault(s) {', '.join(unknown)}; see `kvcheck faults`")
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
    refusal = out_of_range([(option, value, minimum, maximum) for value in values])
    return refusal if refusal is not None else values


def _explore_scope(args: argparse.Namespace) -> object:
    """The scope the options ask for (a named scope with overrides), or a refusal string."""
    import attrs

    from kvcheck.scopes import FEATURES, LAYOUTS, SCOPES

    if args.scope not in SCOPES:
        return f"--scope: unknown scope {args.scope!r} (known: {', '.join(SCOPES)})"
    refusal = out_of_range(
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
        return bad_input(scope)
    assert isinstance(scope, Scope)
    try:
        make_target = resolve_target(args.target, args.fault)
    except ValueError as exc:
        return bad_input(str(exc))
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


# -- campaign ---------------------------------------------------------------------


MAX_CAMPAIGN_WORKERS = 4096


def cmd_campaign(args: argparse.Namespace) -> int:
    import math

    from kvcheck.campaign import RAY_MISSING, import_ray, run_campaign, summary_lines
    from kvcheck.replay import resolve_target

    if not math.isfinite(args.minutes) or args.minutes <= 0:
        return bad_input(f"--minutes: expected a number of minutes above 0, got {args.minutes}")
    refusal = out_of_range(
        [
            ("--workers", args.workers, 1, MAX_CAMPAIGN_WORKERS),
            ("--groups", args.groups, 1, MAX_GROUPS),
            ("--seed", args.seed, 0, MAX_SEED),
            ("--full-check-every", args.full_check_every, 1, MAX_FULL_CHECK_EVERY),
        ]
    )
    if refusal is not None:
        return bad_input(refusal)
    try:
        resolve_target(args.target, args.fault)
    except ValueError as exc:
        return bad_input(str(exc))
    ray = import_ray()
    if ray is None:
        return bad_input(RAY_MISSING)
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
