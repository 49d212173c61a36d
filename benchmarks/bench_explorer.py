"""The exhaustive explorer against the fault catalogue: which faults it kills, at what depth, how fast.

For each catalogued fault, explore the ``standard`` scope restricted to the
drafter or async feature the fault lives in (plain configurations for the
rest), up to depth 5, breadth first, and report the shortest counterexample's
length, the invariant, the states explored and the time.  With ``--scopes``,
explore the named scopes whole on the unmodified target instead and report
their size and speed.  Usage, from the repository root:

    python benchmarks/bench_explorer.py [--faults a,b] [--depth 5] [--seconds 300] [--target vllm]
    python benchmarks/bench_explorer.py --scopes ci,standard --write docs/measurements/explorer-scopes.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attrs
from measurement import provenance, write_markdown

from kvcheck.explore import explore
from kvcheck.faults import FAULTS
from kvcheck.replay import resolve_target
from kvcheck.scopes import SCOPES

FAULT_FEATURES = {
    "eagle-window-without-extra-block": "eagle",
    "admission-ignores-lookahead": "lookahead",
    "spec-output-caches-one-token-short": "spec",
    "reprefillable-tokens-cached": "prefill-lookahead",
    "window-slides-on-scheduled-tokens": "async",
    "deferred-free-in-eviction-order": "deferred",
    "delayed-load-cached-at-allocation": "async",
}
"""The feature a fault needs to show; the others show in plain configurations."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="kvcore", help="kvcore (every fault) or vllm (the faults expressed on it)")
    parser.add_argument("--faults", default=None, help="comma-separated subset of faults")
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=300.0, help="time limit per fault")
    parser.add_argument(
        "--scopes", default=None, help="comma-separated named scopes to explore whole on the unmodified target"
    )
    parser.add_argument("--write", default=None, help="also write the table as Markdown to this file")
    args = parser.parse_args()
    if args.scopes:
        return measure_scopes(args.target, args.scopes.split(","), args.write)
    if args.target == "vllm":
        from kvcheck.faults import VLLM_FAULTS

        catalogue = list(VLLM_FAULTS)
    else:
        catalogue = list(FAULTS)
    names = args.faults.split(",") if args.faults else catalogue
    base = attrs.evolve(SCOPES["standard"], depth=args.depth)
    lines = [
        "# The exhaustive explorer against the fault catalogue",
        "",
        provenance("bench_explorer.py"),
        f"Target {args.target}, scope standard up to depth {args.depth}, {args.seconds:.0f} s per fault at most.",
        "",
        "| fault | features | shortest | invariant | states explored | distinct | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        feature = FAULT_FEATURES.get(name, "plain")
        scope = attrs.evolve(base, features=(feature,))
        report = explore(resolve_target(args.target, name), scope, max_seconds=args.seconds)
        if report.failure is not None:
            shortest, invariant = str(len(report.failure.ops)), report.failure.violation.invariant
        else:
            shortest = "none" if report.exhausted else "not reached"
            invariant = (
                f"(exhausted to depth {args.depth})" if report.exhausted else f"(stopped at depth {len(report.depths)})"
            )
        row = (
            f"| {name} | {feature} | {shortest} | {invariant} | {report.explored:,} | {report.distinct:,} "
            f"| {report.seconds:.1f} |"
        )
        print(row, file=sys.stderr, flush=True)
        lines.append(row)
    write_markdown(args.write, "\n".join(lines))
    return 0


def measure_scopes(target: str, names: list[str], write: str | None) -> int:
    """Explore each named scope whole (its own depth, no time limit) on the unmodified target."""
    unknown = [name for name in names if name not in SCOPES]
    if unknown:
        print(f"--scopes: unknown scope(s) {', '.join(unknown)}; known: {', '.join(SCOPES)}", file=sys.stderr)
        return 2
    lines = [
        "# The explorer's scopes, explored whole",
        "",
        provenance("bench_explorer.py"),
        f"Target {target}, no fault planted; each scope to its own depth.",
        "",
        "| scope | depth | configurations | states explored | distinct | states/s | seconds | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    clean = True
    for name in names:
        scope = SCOPES[name]
        report = explore(resolve_target(target), scope)
        clean = clean and report.failure is None
        verdict = (
            f"{report.failure.violation.invariant} after {len(report.failure.ops)} steps"
            if report.failure is not None
            else "every invariant held"
        )
        row = (
            f"| `{name}` | {scope.depth} | {report.configs:,} | {report.explored:,} | {report.distinct:,} "
            f"| {report.states_per_second:,.0f} | {report.seconds:.1f} | {verdict} |"
        )
        print(row, file=sys.stderr, flush=True)
        lines.append(row)
    write_markdown(write, "\n".join(lines))
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
