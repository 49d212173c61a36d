"""Steps per second of the manager machine and the swarm driver: checks on and off, drafter and async
features on and off, KV cache events on and off, mixed block sizes and finer hashes on and off,
retention intervals on and off.

The runs of a driver with checks on and off draw the same derandomized
examples, so that ratio is the cost of the checks alone.  With the features
off the same configurations are drawn without a drafter, lookahead or async
scheduling.  Usage, from the repository root:

    python benchmarks/bench_machines.py [--examples N] [--steps N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attrs
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from measurement import recorded_output

from kvcheck import lockstep
from kvcheck import swarm as swarm_module
from kvcheck.stateful_tests.manager_machine import manager_machine
from kvcheck.swarm import swarm
from kvcheck.targets import load_target
from kvmodel.config import TargetConfig


def count_steps() -> list[int]:
    """Count every Lockstep step from now on; returns the one-element counter."""
    counter = [0]
    original = lockstep.Lockstep.step

    def counting_step(self: lockstep.Lockstep, op: object) -> object:
        counter[0] += 1
        return original(self, op)  # type: ignore[arg-type]

    lockstep.Lockstep.step = counting_step  # type: ignore[assignment,method-assign]
    return counter


def run(check: bool, features: bool, examples: int, steps: int, counter: list[int]) -> tuple[int, float]:
    counter[0] = 0
    machine = manager_machine(load_target("kvcore"), None, check, features)
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


MODES = ((True, True), (False, True), (True, False), (False, False))
"""(checked, drafter and async features) pairs, in the order they are printed."""


def print_table(title: str, best: dict[tuple[bool, bool], float]) -> None:
    print(title)
    print(f"  {'':28} {'features on':>12} {'features off':>13}")
    for check, name in ((True, "all invariants checked"), (False, "checks off")):
        print(f"  {name:28} {best[(check, True)]:12,.0f} {best[(check, False)]:13,.0f}  steps/s")
    print(
        f"  {'checked / unchecked':28} {best[(True, True)] / best[(False, True)]:12.2f} "
        f"{best[(True, False)] / best[(False, False)]:13.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", default=None, help="also write the report as Markdown to this file")
    args = parser.parse_args()
    with recorded_output(args.write, "Machine and swarm speed, and what each check costs", "bench_machines.py"):
        measure_all(args)


def measure_all(args: argparse.Namespace) -> None:
    counter = count_steps()
    best: dict[tuple[bool, bool], float] = {}
    for _ in range(args.repeats):
        for check, features in MODES:
            n_steps, seconds = run(check, features, args.examples, args.steps, counter)
            best[(check, features)] = max(best.get((check, features), 0.0), n_steps / seconds)
    print_table(
        f"manager machine, kvcore, {args.examples} examples x <= {args.steps} steps, best of {args.repeats}", best
    )
    swarm_best: dict[tuple[bool, bool], float] = {}
    for _ in range(args.repeats):
        for check, features in MODES:
            report = swarm(
                load_target("kvcore"),
                seed=0,
                max_runs=args.examples,
                steps_per_run=args.steps,
                check=check,
                drafter_and_async=features,
            )
            swarm_best[(check, features)] = max(swarm_best.get((check, features), 0.0), report.steps / report.seconds)
    print_table(f"swarm driver, kvcore, {args.examples} runs x {args.steps} steps, best of {args.repeats}", swarm_best)
    print_fast_mode(args)
    print_events_cost(args)
    print_block_sizes_cost(args)
    print_retention_cost(args)
    print_context_parallel_cost(args)
    print_mamba_align_cost(args)
    print_sub_block_cost(args)
    print_zeroing_cost(args)
    print_checkpoint_cost(args)


FAST_INTERVALS = (1, 4, 8, 16)
"""Steps between two full checks of the swarm driver's state (1: today's path, every step)."""


def print_fast_mode(args: argparse.Namespace) -> None:
    """The swarm driver's fast mode, same draws: the whole state checked every N steps (and at each run's
    end, and while steps are in flight), the step's results in between; against every step and no checks."""
    best: dict[int | None, float] = {}
    for _ in range(args.repeats):
        for every in (*FAST_INTERVALS, None):
            report = swarm(
                load_target("kvcore"),
                seed=0,
                max_runs=args.examples,
                steps_per_run=args.steps,
                check=every is not None,
                full_check_every=every or 1,
            )
            best[every] = max(best.get(every, 0.0), report.steps / report.seconds)
    print(
        f"swarm driver fast mode, kvcore, features on, {args.examples} runs x {args.steps} steps, "
        f"best of {args.repeats}"
    )
    for every in FAST_INTERVALS:
        name = "every step (today's path)" if every == 1 else f"every {every} steps"
        print(f"  {'full check ' + name:36} {best[every]:10,.0f} steps/s  {best[every] / best[1]:5.2f}x")
    print(f"  {'checks off (the ceiling)':36} {best[None]:10,.0f} steps/s  {best[None] / best[1]:5.2f}x")


def print_events_cost(args: argparse.Namespace) -> None:
    """KV cache events forced on, then off, in every run of the swarm driver (the same draws otherwise),
    checked and unchecked: what taking, predicting and checking the stream costs."""

    def forced(drawn: Callable[..., TargetConfig], events: bool) -> Callable[..., TargetConfig]:
        def config(*args: Any, **kwargs: Any) -> TargetConfig:
            return attrs.evolve(drawn(*args, **kwargs), enable_kv_cache_events=events)

        return config

    print_on_off_cost(args, forced, "KV cache events in every run or none", ("events on", "events off"))


def print_block_sizes_cost(args: argparse.Namespace) -> None:
    """Mixed block sizes and hashes finer than the blocks drawn for every multi-group run of the swarm
    driver that vLLM accepts, then for none (the same draws otherwise), checked and unchecked: what
    per-group block sizes, hash views, sparse window caching and partial entries cost."""
    print_on_off_cost(
        args,
        drawn_share("block_sizes_share"),
        "mixed block sizes and finer hashes in every multi-group run or none",
        ("sizes mixed", "one size"),
    )


def print_retention_cost(args: argparse.Namespace) -> None:
    """A retention interval drawn for every swarm run with caching and a sliding window, then for none
    (the same draws otherwise), checked and unchecked: what the per-request mask of the window's cached
    blocks, the replay boundaries and the shared prefix cost."""
    print_on_off_cost(
        args,
        drawn_share("retention_share"),
        "a retention interval in every run with caching and a sliding window or in none",
        ("interval", "none"),
    )


def print_context_parallel_cost(args: argparse.Namespace) -> None:
    """A decode context parallel world size drawn for every swarm run vLLM accepts it in, then for none
    (the same draws otherwise), checked and unchecked: what the sharded block sizes cost."""
    print_on_off_cost(
        args,
        drawn_share("dcp_share"),
        "a DCP world size of 2 or 4 in every run that takes one or in none",
        ("sharded", "one rank"),
    )


def print_mamba_align_cost(args: argparse.Namespace) -> None:
    """Hybrid and pure Mamba layouts in every swarm run, with prefix caching (Mamba's align mode: null
    padding, state hits, block-aligned prefill chunks), then without it (the none mode, the same draws
    otherwise), checked and unchecked: what the align mode costs beside the none mode."""

    def forced(drawn: ConfigDraw, align: bool) -> ConfigDraw:
        def config(*args: Any, **kwargs: Any) -> TargetConfig:
            return drawn(*args, **kwargs, layout="mamba", caching=align)

        return config

    print_on_off_cost(
        args, forced, "Mamba layouts in every run, align mode (caching on) or none mode", ("align", "none")
    )


def print_sub_block_cost(args: argparse.Namespace) -> None:
    """Hybrid Mamba layouts with prefix caching in every swarm run (every group hashed at the cache's
    block size), the state blocks twice as large (hits ending inside a block, copies on write), then of
    the cache's block size (the same draws otherwise), checked and unchecked: what sub-block hits cost."""

    def forced(drawn: ConfigDraw, wider: bool) -> ConfigDraw:
        def config(rng: Any, num_groups: int | None = None, **kwargs: Any) -> TargetConfig:
            share = 1.0 if wider else 0.0
            return drawn(
                rng,
                rng.randint(2, 4),
                **kwargs,
                layout="mamba",
                caching=True,
                block_sizes_share=0.0,
                sub_block_share=share,
            )

        return config

    print_on_off_cost(
        args, forced, "hybrid Mamba layouts with caching in every run, sub-block hits on or off", ("sub-block", "block")
    )


def print_zeroing_cost(args: argparse.Namespace) -> None:
    """Attention groups of two KV cache dtypes in every swarm run with two attention groups or more (new
    blocks recorded for zeroing and checked), then in none (the same draws otherwise), checked and
    unchecked: what the zeroing records cost."""
    print_on_off_cost(
        args,
        drawn_share("mixed_precision_share"),
        "two KV cache dtypes in every run with two attention groups or more, or in none",
        ("zeroed", "one dtype"),
    )


def print_checkpoint_cost(args: argparse.Namespace) -> None:
    """Mamba layouts with prefix caching (the align mode) in every swarm run, every one with prefill
    checkpoints, then none (the same draws otherwise), checked and unchecked: what the checkpoints cost."""

    def forced(drawn: ConfigDraw, on: bool) -> ConfigDraw:
        def config(*args: Any, **kwargs: Any) -> TargetConfig:
            return drawn(*args, **kwargs, layout="mamba", caching=True, checkpoint_share=1.0 if on else 0.0)

        return config

    print_on_off_cost(
        args, forced, "align-mode Mamba layouts in every run, prefill checkpoints or none", ("checkpoints", "none")
    )


ConfigDraw = Callable[..., TargetConfig]


def drawn_share(keyword: str) -> Callable[[ConfigDraw, bool], ConfigDraw]:
    """A feature drawn wherever it can be (``keyword`` of ``random_config`` at 1) or nowhere (at 0)."""

    def share(drawn: ConfigDraw, on: bool) -> ConfigDraw:
        def config(*args: Any, **kwargs: Any) -> TargetConfig:
            return drawn(*args, **{keyword: 1.0 if on else 0.0}, **kwargs)

        return config

    return share


def print_on_off_cost(
    args: argparse.Namespace, switch: Callable[[ConfigDraw, bool], ConfigDraw], what: str, columns: tuple[str, str]
) -> None:
    """The swarm driver's steps/s with a feature on in every run (``switch(draw, True)`` wraps the
    configuration draw), then off, checked and unchecked, and the ratios."""
    drawn = swarm_module.random_config
    best: dict[tuple[bool, bool], float] = {}
    try:
        for _ in range(args.repeats):
            for check, on in ((True, True), (True, False), (False, True), (False, False)):
                swarm_module.random_config = switch(drawn, on)  # type: ignore[assignment]
                report = swarm(
                    load_target("kvcore"), seed=0, max_runs=args.examples, steps_per_run=args.steps, check=check
                )
                best[(check, on)] = max(best.get((check, on), 0.0), report.steps / report.seconds)
    finally:
        swarm_module.random_config = drawn
    print(f"swarm driver, kvcore, {what}, same draws, best of {args.repeats}")
    print(f"  {'':28} {columns[0]:>12} {columns[1]:>13}")
    for check, name in ((True, "all invariants checked"), (False, "checks off")):
        print(f"  {name:28} {best[(check, True)]:12,.0f} {best[(check, False)]:13,.0f}  steps/s")
    print(
        f"  {columns[0] + ' / ' + columns[1]:28} {best[(True, True)] / best[(True, False)]:12.2f} "
        f"{best[(False, True)] / best[(False, False)]:13.2f}"
    )


if __name__ == "__main__":
    main()
