"""vLLM's own scheduler in the loop: how fast workloads run through it with every call checked, and which
faults expressed against vLLM it catches.

First the search runs clean (``--runs`` workloads from ``--seed``) and reports engine steps, allocator
calls checked per second, preemptions and stalls; then each fault expressed against vLLM is planted
into the scheduler's own manager and searched for with the same seed and budget, reporting the run
that caught it, the invariant, and the failure's length before and after shrinking.  Needs vLLM (run
it with the vLLM venv's Python), from the repository root:

    .venv-vllm/bin/python benchmarks/bench_scheduler.py
    .venv-vllm/bin/python benchmarks/bench_scheduler.py --runs 300 --write docs/measurements/scheduler.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measurement import provenance, write_markdown

from kvcheck.faults import VLLM_FAULTS
from kvcheck.targets.vllm_target import require_vllm
from kvcheck.vllm_scheduler.search import search


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=150, help="workloads per search (default 150)")
    parser.add_argument("--seed", type=int, default=1, help="the searches' seed (default 1)")
    parser.add_argument("--faults", default=None, help="comma-separated subset of the faults expressed against vLLM")
    parser.add_argument("--write", default=None, help="also write the report as Markdown to this file")
    args = parser.parse_args()
    faults = args.faults.split(",") if args.faults else list(VLLM_FAULTS)
    version = require_vllm().version
    search(seed=args.seed, max_runs=1)  # builds the first scheduler (and caches the model's inspection)
    clean = search(seed=args.seed, max_runs=args.runs)
    lines = [
        "# vLLM's own scheduler in the loop",
        "",
        provenance("bench_scheduler.py"),
        f"vLLM {version}, synchronous scheduler, first come first served; {args.runs} workloads per search "
        f"from seed {args.seed}.",
        "",
        "| search | workloads | engine steps | calls checked | calls/s | preemptions | stalled runs | verdict |",
        "|---|---|---|---|---|---|---|---|",
        f"| clean | {clean.runs:,} | {clean.steps:,} | {clean.operations:,} | "
        f"{clean.operations / clean.seconds:,.0f} | {clean.preemptions:,} | {clean.stalled:,} | "
        f"{clean.failure.violation.invariant if clean.failure else 'every invariant held'} |",
        "",
        "| fault | caught in run | invariant | operations | shrunk to | seconds |",
        "|---|---|---|---|---|---|",
    ]
    caught = 0
    for fault in faults:
        start = time.perf_counter()
        report = search(seed=args.seed, max_runs=args.runs, plant=VLLM_FAULTS[fault].plant)
        seconds = time.perf_counter() - start
        if report.failure is None or report.shrunk is None:
            row = f"| {fault} | not in {report.runs} | - | - | - | {seconds:.1f} |"
        else:
            caught += 1
            row = (
                f"| {fault} | {report.runs} | {report.shrunk.violation.invariant} | "
                f"{len(report.failure.record.ops)} | {len(report.shrunk.record.ops)} | {seconds:.1f} |"
            )
        print(row, file=sys.stderr, flush=True)
        lines.append(row)
    lines += ["", f"Caught {caught} of {len(faults)} faults."]
    write_markdown(args.write, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
