"""Detection power of the Hypothesis manager machine: catch rate and time-to-report per fault.

For each catalogued fault, run the manager machine (the ``dev`` profile's
budget, no example database) from N random seeds, in the layout the fault
declares it is hunted in (groups drawn from 1 to 4, or the machine's Mamba
layouts, or Mamba beside local attention; ``--layout`` runs every fault in
one), and report how many runs caught the fault, the time from start until
the shrunk repro is ready (median and max over the catching runs), the
shrunk lengths and the invariants that fired.  Seeds are printed so that
any run can be repeated (``--seed-base``).

    python benchmarks/bench_detection.py                 # every fault, 20 seeds, 2 workers
    python benchmarks/bench_detection.py --faults interleaved-external-alloc --seeds 50
    python benchmarks/bench_detection.py --target vllm   # the faults expressed against vLLM
    python benchmarks/bench_detection.py --layout mamba --faults partial-hit-not-copied
    python benchmarks/bench_detection.py --write docs/measurements/detection.md

Figures are wall-clock on whatever machine runs it; compare them within
one run.  Run from the repository root.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import settings
from measurement import provenance, write_markdown

from kvcheck.faults import FAULTS, VLLM_FAULTS
from kvcheck.profiles import PROFILES, pin_generation_constants
from kvcheck.replay import resolve_target
from kvcheck.stateful_tests.run import ShrunkViolation, run_manager_machine

LAYOUT_NAMES = {None: "groups drawn from 1 to 4", "mamba": "Mamba layouts", "samba": "Mamba beside local attention"}
"""The layouts a fault is hunted in, as the report names them."""

Outcome = tuple[str, int, bool, float, int | None, str | None]
"""(fault, seed, caught, seconds to report, shrunk steps, invariant)."""


def hunt(task: tuple[str, str, int, int, int | str | None]) -> Outcome:
    """One manager-machine run against one fault from one seed."""
    target, fault, seed, examples, layout = task
    pin_generation_constants()
    base = settings(PROFILES["dev"], max_examples=examples, database=None)
    start = time.perf_counter()
    try:
        run_manager_machine(resolve_target(target, fault), num_groups=layout, base=base, seed=seed)
    except ShrunkViolation as violation:
        return fault, seed, True, time.perf_counter() - start, violation.step, violation.invariant
    return fault, seed, False, time.perf_counter() - start, None, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--target", default="kvcore", help="kvcore (every fault) or vllm (the faults expressed against it)"
    )
    parser.add_argument("--faults", default=None, help="comma-separated subset of faults")
    parser.add_argument("--seeds", type=int, default=20, help="random seeds per fault (default 20)")
    parser.add_argument("--seed-base", type=int, default=None, help="use seeds base..base+N-1 instead of random")
    parser.add_argument("--examples", type=int, default=PROFILES["dev"].max_examples, help="examples per run")
    parser.add_argument("--workers", type=int, default=2, help="parallel processes (default 2)")
    parser.add_argument(
        "--layout",
        default=None,
        choices=["drawn", "mamba", "samba"],
        help="run every fault in groups drawn from 1 to 4, the manager machine's Mamba layouts alone, or "
        "Mamba beside local attention (default: each fault in the layout it declares)",
    )
    parser.add_argument("--write", default=None, help="also write the table as Markdown to this file")
    args = parser.parse_args()

    catalogue = VLLM_FAULTS if args.target == "vllm" else FAULTS
    faults = args.faults.split(",") if args.faults else list(catalogue)
    unknown = [fault for fault in faults if fault not in catalogue]
    if unknown:
        parser.error(f"--faults: not in the {args.target} catalogue: {', '.join(unknown)}")
    forced = None if args.layout in (None, "drawn") else args.layout
    layout = {fault: forced if args.layout else catalogue[fault].layout for fault in faults}
    if args.seed_base is None:
        seeds = [random.SystemRandom().randrange(2**32) for _ in range(args.seeds)]
    else:
        seeds = list(range(args.seed_base, args.seed_base + args.seeds))
    tasks = [(args.target, fault, seed, args.examples, layout[fault]) for fault in faults for seed in seeds]
    layouts = (
        LAYOUT_NAMES[forced]
        if args.layout
        else "each fault in the layout it declares (drawn: groups drawn from 1 to 4; mamba: the Mamba layouts; "
        "samba: Mamba beside local attention)"
    )
    # The commit the runs measure, taken before they start (a run of an hour may see later commits).
    written_by = provenance("bench_detection.py")
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        outcomes = pool.map(hunt, tasks, chunksize=1)
    lines = [
        "# Detection power of the manager machine",
        "",
        written_by,
        f"Target {args.target}, {len(faults)} faults x {len(seeds)} seeds, {args.examples} examples per run, "
        f"{layouts}; {len(tasks)} runs in {time.perf_counter() - start:.0f} s on {args.workers} workers.",
        f"Seeds: {seeds}.",
        "",
        "| fault | layout | caught | report s (median) | report s (max) | shrunk steps | invariants |",
        "|---|---|---|---|---|---|---|",
    ]
    weakest = len(seeds)
    for fault in faults:
        mine = [o for o in outcomes if o[0] == fault]
        caught = [o for o in mine if o[2]]
        weakest = min(weakest, len(caught))
        times = [o[3] for o in caught]
        steps = [o[4] for o in caught if o[4] is not None]
        invariants = Counter(o[5] for o in caught)
        missed = [o[1] for o in mine if not o[2]]
        median = f"{statistics.median(times):.1f}" if times else "-"
        worst = f"{max(times):.1f}" if times else "-"
        span = f"{min(steps)}-{max(steps)}" if steps else "-"
        names = ", ".join(f"{name} ({n})" for name, n in invariants.most_common())
        where = layout[fault] or "drawn"
        lines.append(f"| {fault} | {where} | {len(caught)}/{len(mine)} | {median} | {worst} | {span} | {names} |")
        if missed:
            lines.append(f"|   missed from seeds {missed} | | | | | | |")
    every = [o[3] for o in outcomes if o[2]]
    if every:
        lines += ["", f"All catches: time-to-report median {statistics.median(every):.1f}s, max {max(every):.1f}s."]
    lines.append(f"Weakest catch rate: {weakest}/{len(seeds)}.")
    write_markdown(args.write, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
