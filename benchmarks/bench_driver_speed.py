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
import datetime
import json
import multiprocessing
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = """
import importlib.util, json, sys, time
from pathlib import Path
sys.path.insert(0, {tree!r})
import kvcheck
# The folders the package maps into kvcheck, taken from this tree (not from wherever kvcheck is installed from).
for folder in ("models", "stateful_tests"):
    path = Path({tree!r}) / folder
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            f"kvcheck.{{folder}}", path / "__init__.py", submodule_search_locations=[str(path)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"kvcheck.{{folder}}"] = module
        spec.loader.exec_module(module)
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
search = settings(max_examples={examples}, stateful_step_count=40, derandomize=False, database=None,
                  deadline=None, suppress_health_check=list(HealthCheck))
start = time.perf_counter()
run_state_machine_as_test(machine, settings=search)
machine_rate = steps[0] / (time.perf_counter() - start)
report = swarm(load_target("kvcore"), seed=0, max_runs={examples}, steps_per_run=40)
print(json.dumps({{"machine": machine_rate, "swarm": report.steps / report.seconds}}))
"""


def measure(tree: Path, examples: int) -> dict[str, float]:
    script = MEASURE.format(tree=str(tree), examples=examples)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tree, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measuring {tree} failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default=None, help="also measure this git revision, beside the checkout")
    parser.add_argument("--examples", type=int, default=300, help="manager-machine examples and swarm runs")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs per tree")
    parser.add_argument("--write", type=Path, default=None, help="also write the table as Markdown to this file")
    args = parser.parse_args()

    head = git("rev-parse", "--short", "HEAD") + (" with uncommitted changes" if git("status", "--porcelain") else "")
    with tempfile.TemporaryDirectory() as scratch:
        trees = {f"checkout ({head})": ROOT}
        if args.rev is not None:
            worktree = Path(scratch) / "rev"
            git("worktree", "add", "--detach", str(worktree), args.rev)
            trees = {f"{args.rev}": worktree, **trees}
        try:
            best: dict[str, dict[str, float]] = {name: {"machine": 0.0, "swarm": 0.0} for name in trees}
            for _ in range(args.repeats):
                for name, tree in trees.items():
                    for driver, rate in measure(tree, args.examples).items():
                        best[name][driver] = max(best[name][driver], rate)
        finally:
            if args.rev is not None:
                git("worktree", "remove", "--force", str(worktree))

    first = next(iter(best.values()))
    lines = [
        "# Driver speed",
        "",
        f"Written by `{' '.join(['python benchmarks/bench_driver_speed.py', *sys.argv[1:]])}` on "
        f"{datetime.date.today()}, {platform.machine()} with {multiprocessing.cpu_count()} cores: kvcore, checks on, "
        f"{args.examples} manager-machine examples and swarm runs of up to 40 steps, best of {args.repeats}.",
        "",
        "| tree | manager machine steps/s | ratio | swarm steps/s | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, rates in best.items():
        lines.append(
            f"| {name} | {rates['machine']:,.0f} | {rates['machine'] / first['machine']:.2f} "
            f"| {rates['swarm']:,.0f} | {rates['swarm'] / first['swarm']:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
