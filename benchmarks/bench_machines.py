"""Steps per second of the state machines, with every invariant checked and with checks off.

Both runs of a machine draw the same derandomized examples, so the ratio
is the cost of the checks alone.  Usage, from the repository root:

    python benchmarks/bench_machines.py [--examples N] [--steps N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck import lockstep
from kvcheck.swarm import swarm
from kvcheck.targets import load_target
from stateful_tests.manager_machine import manager_machine


def count_steps() -> list[int]:
    """Count every Lockstep step from now on; returns the one-element counter."""
    counter = [0]
    original = lockstep.Lockstep.step

    def counting_step(self: lockstep.Lockstep, op: object) -> object:
        counter[0] += 1
        return original(self, op)  # type: ignore[arg-type]

    lockstep.Lockstep.step = counting_step  # type: ignore[assignment,method-assign]
    return counter


def run(check: bool, examples: int, steps: int, counter: list[int]) -> tuple[int, float]:
    counter[0] = 0
    machine = manager_machine(load_target("kvcore"), None, check)
    run_settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    start = time.perf_counter()
    run_state_machine_as_test(machine, settings=run_settings)
    return counter[0], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    counter = count_steps()
    best: dict[bool, float] = {}
    for _ in range(args.repeats):
        for check in (True, False):
            n_steps, seconds = run(check, args.examples, args.steps, counter)
            best[check] = max(best.get(check, 0.0), n_steps / seconds)
    print(f"manager machine, kvcore, {args.examples} examples x <= {args.steps} steps, best of {args.repeats}")
    print(f"  all invariants checked: {best[True]:10,.0f} steps/s")
    print(f"  checks off:             {best[False]:10,.0f} steps/s")
    print(f"  checked / unchecked:    {best[True] / best[False]:10.2f}")
    swarm_best: dict[bool, float] = {}
    for _ in range(args.repeats):
        for check in (True, False):
            report = swarm(load_target("kvcore"), seed=0, max_runs=args.examples, steps_per_run=args.steps, check=check)
            swarm_best[check] = max(swarm_best.get(check, 0.0), report.steps / report.seconds)
    print(f"swarm driver, kvcore, {args.examples} runs x {args.steps} steps, best of {args.repeats}")
    print(f"  all invariants checked: {swarm_best[True]:10,.0f} steps/s")
    print(f"  checks off:             {swarm_best[False]:10,.0f} steps/s")
    print(f"  checked / unchecked:    {swarm_best[True] / swarm_best[False]:10.2f}")


if __name__ == "__main__":
    main()
