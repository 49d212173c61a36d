"""How often the manager machine reaches each coverage label at the ``ci`` budget: the ci run of each
layout, and runs from random seeds.

The ci run is what CI gates on: every label a layout's run must reach
(:func:`kvcheck.coverage.labels.reachable_labels`) has to be reached
there.  A label reached only once or twice in it hangs on luck, and runs
from other seeds show whether the search reaches it or one seed happened
to.  For each layout this prints, per label, the count in the ci run and the
fewest (and how many seeds missed it) over the seeded runs.

    python benchmarks/bench_labels.py                  # ci run + 10 random seeds, every layout
    python benchmarks/bench_labels.py --seeds 0        # the ci run alone
    python benchmarks/bench_labels.py --layouts mamba,samba --seed-base 100
    python benchmarks/bench_labels.py --write docs/measurements/labels.md

A run that meets an invariant violation is reported with it, its counts those reached before it.
Exit status 1 when a label is reached fewer than ``--min-ci`` times in a ci
run, not at all under some seed, or when a run meets a violation.  Run from the repository root.
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

from kvcheck.coverage.labels import EXAMPLES_FACTOR, GROUP_LAYOUTS, reachable_labels
from kvcheck.coverage.tally import LABELS_SEEN
from kvcheck.profiles import PROFILES, pin_generation_constants
from kvcheck.stateful_tests.run import ShrunkViolation, run_manager_machine
from kvcheck.targets import load_target

Layout = int | str | None
Task = tuple[Layout, int | None]
"""(layout, seed); seed None is the ci run."""


def layout_name(layout: Layout) -> str:
    return "groups-1-to-4" if layout is None else str(layout)


def parse_layout(text: str) -> Layout:
    if text == "groups-1-to-4":
        return None
    return int(text) if text.isdigit() else text


def ci_settings(layout: Layout) -> settings:
    """The ci profile, with a layout's larger budget where it has one, as the ci run of the layout searches."""
    base = PROFILES["ci"]
    return settings(base, max_examples=EXAMPLES_FACTOR.get(layout, 1) * base.max_examples)


def count_labels(task: Task) -> tuple[Task, dict[str, int], str | None]:
    """One manager-machine run on kvcore: the labels it reached, with their counts, and the violation
    that ended it early, if one did (its counts are then those reached before it)."""
    layout, seed = task
    pin_generation_constants()
    LABELS_SEEN.clear()
    try:
        run_manager_machine(load_target("kvcore"), layout, ci_settings(layout), seed=seed)
    except ShrunkViolation as violation:
        return task, dict(LABELS_SEEN), str(violation)
    return task, dict(LABELS_SEEN), None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default=None, help="comma-separated layouts (default: every one CI runs)")
    parser.add_argument("--seeds", type=int, default=10, help="random seeds per layout beside the ci run")
    parser.add_argument("--seed-base", type=int, default=None, help="use seeds base..base+N-1 instead of random")
    parser.add_argument("--min-ci", type=int, default=3, help="fewest times the ci run must reach a label")
    parser.add_argument("--workers", type=int, default=2, help="parallel processes (default 2)")
    parser.add_argument("--write", type=Path, default=None, help="also write the tables as Markdown to this file")
    args = parser.parse_args()

    layouts = [parse_layout(text) for text in args.layouts.split(",")] if args.layouts else list(GROUP_LAYOUTS)
    if args.seed_base is None:
        seeds = [random.randrange(2**32) for _ in range(args.seeds)]
    else:
        seeds = list(range(args.seed_base, args.seed_base + args.seeds))
    tasks: list[Task] = [(layout, seed) for layout in layouts for seed in (None, *seeds)]
    start = time.perf_counter()
    with multiprocessing.Pool(args.workers) as pool:
        results = pool.map(count_labels, tasks, chunksize=1)
    elapsed = time.perf_counter() - start

    counts: dict[Task, dict[str, int]] = {task: found for task, found, _ in results}
    violations = {task: violation for task, _, violation in results if violation is not None}
    lines = [
        "# Coverage labels at the ci budget",
        "",
        provenance("bench_labels.py"),
        f"It took {elapsed:.0f} s.",
        f"Seeds: {', '.join(map(str, seeds)) or 'none'}.",
        "",
    ]
    failures = []
    for layout in layouts:
        ci_counts = Counter(counts[(layout, None)])
        header = "| label | ci run | fewest over seeds | median over seeds | seeds missing it |"
        lines += [f"## {layout_name(layout)}", "", header]
        lines.append("|---|---:|---:|---:|---:|")
        for label in reachable_labels(layout):
            seeded = [Counter(counts[(layout, seed)])[label] for seed in seeds]
            fewest = min(seeded) if seeded else "-"
            median = statistics.median(seeded) if seeded else "-"
            missing = sum(1 for n in seeded if n == 0)
            lines.append(f"| {label} | {ci_counts[label]} | {fewest} | {median} | {missing} |")
            if ci_counts[label] < args.min_ci:
                failures.append(f"{layout_name(layout)}: {label!r} reached {ci_counts[label]} times in the ci run")
            if missing:
                failures.append(f"{layout_name(layout)}: {label!r} missed under {missing} of {len(seeds)} seeds")
        lines.append("")
        for (_, seed), violation in sorted(
            ((task, v) for task, v in violations.items() if task[0] == layout), key=lambda item: str(item[0][1])
        ):
            run = "the ci run" if seed is None else f"seed {seed}"
            first_line = violation.splitlines()[0]
            lines += [f"{run} ended early on a violation (its counts are those before it): {first_line}", ""]
            failures.append(f"{layout_name(layout)}: {run} met a violation: {first_line}")
    write_markdown(args.write, "\n".join(lines))
    for failure in failures:
        print("SHORT:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
