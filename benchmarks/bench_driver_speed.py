"""Steps per second of the manager machine and the swarm driver on kvcore, for one or several source trees
measured in the same run: the same draws (a fixed seed), checks on, best of N, the trees taking turns so
that a change in the machine's load touches each alike.

    python benchmarks/bench_driver_speed.py                        # this checkout
    python benchmarks/bench_driver_speed.py --rev a71500e          # a commit against this checkout
    python benchmarks/bench_driver_speed.py --rev a71500e --write docs/measurements/driver-speed.md

Each tree runs in a fresh interpreter that imports kvcheck, and the folders the package maps into it, from
that tree.  A revision is checked out
into a temporary git worktree, removed afterwards.  Compare the ratio column: absolute figures depend
on the machine and its load.  Run from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from measurement import checked_out, commit, provenance, run_in_tree, write_markdown

MEASURE = """
import json, time
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test
from kvcheck import lockstep
from kvcheck.stateful_tests.manager_machine import manager_machine
from kvcheck.swarm import swarm
from kvcheck.targets import load_target

steps = [0]
original = lockstep.Lockstep.step
def counting(self, op):
    steps[0] += 1
    return original(self, op)
lockstep.Lockstep.step = counting

machine = seed(0)(manager_machine(load_target("kvcore"), None))
search = settings(max_examples=EXAMPLES, stateful_step_count=40, derandomize=False, database=None,
                  deadline=None, suppress_health_check=list(HealthCheck))
start = time.perf_counter()
run_state_machine_as_test(machine, settings=search)
machine_rate = steps[0] / (time.perf_counter() - start)
report = swarm(load_target("kvcore"), seed=0, max_runs=EXAMPLES, steps_per_run=40)
print(json.dumps({"machine": machine_rate, "swarm": report.steps / report.seconds}))
"""


def measure(tree: Path, examples: int) -> dict[str, float]:
    result: dict[str, float] = json.loads(run_in_tree(tree, f"EXAMPLES = {examples}\n" + MEASURE))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default=None, help="also measure this git revision, beside the checkout")
    parser.add_argument("--examples", type=int, default=300, help="manager-machine examples and swarm runs")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs per tree")
    parser.add_argument("--write", type=Path, default=None, help="also write the table as Markdown to this file")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        trees = {args.rev: stack.enter_context(checked_out(args.rev))} if args.rev is not None else {}
        trees[f"this checkout ({commit()})"] = Path(__file__).resolve().parents[1]
        best: dict[str, dict[str, float]] = {name: {"machine": 0.0, "swarm": 0.0} for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():
                for driver, rate in measure(tree, args.examples).items():
                    best[name][driver] = max(best[name][driver], rate)

    first = next(iter(best.values()))
    lines = [
        "# Driver speed",
        "",
        provenance("bench_driver_speed.py"),
        f"kvcore, checks on, {args.examples} manager-machine examples and swarm runs of up to 40 steps, "
        f"best of {args.repeats}, the trees taking turns.",
        "",
        "| tree | manager machine steps/s | ratio | swarm steps/s | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, rates in best.items():
        lines.append(
            f"| {name} | {rates['machine']:,.0f} | {rates['machine'] / first['machine']:.2f} "
            f"| {rates['swarm']:,.0f} | {rates['swarm'] / first['swarm']:.2f} |"
        )
    write_markdown(args.write, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
