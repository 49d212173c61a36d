"""Allocator throughput: kvcore against vLLM v1's allocator, when vLLM is importable.

Workloads (one *op* is named in the unit column of the table):

1. Pool alloc/free cycle: ``get_new_blocks(n)`` then ``free_blocks`` of the
   same blocks tail first, on a bare block pool (1,000 and 100,000 blocks,
   prefix caching on and off).
2. Request lifecycle through the ``KVCacheManager`` facade, prefix caching on:
   64-token prompts sharing a 32-token prefix, block size 16, requests run in
   batches; each request takes its prefix hit, allocates its prompt, then
   decodes 16 tokens one ``allocate_slots(req, 1)`` at a time, then is freed.
   Configs: one full-attention group; one full-attention plus two
   sliding-window groups.

kvcore always runs.  When ``import vllm`` works, the same workloads run on
vLLM in this process, driven by the same loop, after a short lockstep run
that checks both allocators hand out the same block ids (a sanity check on
the benchmark, not a test).  Each figure is the best of ``--repeats`` timed
repeats, kvcore's and vLLM's alternating so that a busy machine slows both
alike; the ratio column is kvcore/vLLM of the bests, ``(median)`` that of
the medians.  Pools, managers and requests are built outside the timed
region; appending output tokens (and hashing the block they complete, with
each allocator's own SHA-256 block hash) is inside it.  Objects alive before
timing are frozen out of the garbage collector (``gc.freeze``), since a full
collection over torch and vLLM would land inside a random repeat.

Usage::

    python benchmarks/bench_allocators.py [--repeats N] [--scale X] [--json PATH] [--no-vllm]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from measurement import recorded_output

try:
    import kvcore
except ImportError:  # a checkout that is not installed: use the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import kvcore

BLOCK_SIZE = 16
PROMPT_TOKENS = 64
SHARED_PREFIX_TOKENS = 32
DECODE_STEPS = 16
SLIDING_WINDOW_TOKENS = 32
BATCH_SIZE = 8
"""Requests in flight together in the lifecycle workload."""
LIFECYCLE_NUM_BLOCKS = 512
"""Enough that no allocation is refused (a batch holds at most 120), few enough that cached blocks get evicted."""
OUTPUT_TOKEN = 7
UNIQUE_TOKEN_BASE = 100_000

POOL_CYCLE_BLOCKS = 32
POOL_CONFIGS = ((1_000, True), (1_000, False), (100_000, True), (100_000, False))
LIFECYCLE_CONFIGS = ("full", "hybrid")
POOL_CYCLES_PER_REPEAT = 3_000
LIFECYCLE_REQUESTS_PER_REPEAT = 240

LOCKSTEP_NUM_BLOCKS = 256
"""Small enough that the short lockstep run evicts cached blocks."""
LOCKSTEP_REQUESTS = 96


def prompt_token_ids(index: int) -> list[int]:
    """Request ``index``'s prompt: the shared prefix, then tokens no other request has."""
    unique = PROMPT_TOKENS - SHARED_PREFIX_TOKENS
    start = UNIQUE_TOKEN_BASE + index * unique
    return list(range(1, SHARED_PREFIX_TOKENS + 1)) + list(range(start, start + unique))


# -- backends: construction and observation only; the timed loops are shared --


class KvcoreBackend:
    name = "kvcore"

    def make_pool(self, num_blocks: int, enable_caching: bool) -> Any:
        return kvcore.BlockPool(num_blocks, enable_caching)

    def make_manager(self, config: str, num_blocks: int) -> Any:
        groups: list[kvcore.AttentionSpec] = [kvcore.FullAttentionSpec(BLOCK_SIZE)]
        if config == "hybrid":
            groups += [kvcore.SlidingWindowSpec(BLOCK_SIZE, SLIDING_WINDOW_TOKENS)] * 2
        return kvcore.KVCacheManager(kvcore.KVCacheConfig(num_blocks, groups, enable_caching=True))

    def make_request(self, index: int) -> Any:
        return kvcore.Request(f"req-{index}", prompt_token_ids(index), BLOCK_SIZE)

    def free_block_ids(self, manager: Any) -> list[int]:
        return list(manager.free_block_ids())


class VllmBackend:
    """vLLM v1's allocator, built by the vLLM target's construction helpers (caching on, no connector)."""

    name = "vLLM"

    def __init__(self) -> None:
        from kvcheck.targets import vllm_target
        from kvmodel.group_spec import GroupSpec

        self.version = vllm_target.require_vllm().version
        self._vllm = vllm_target
        self._groups = {
            "full": [GroupSpec(kind="full")],
            "hybrid": [GroupSpec(kind="full")] + [GroupSpec(kind="sliding_window", window=SLIDING_WINDOW_TOKENS)] * 2,
        }

    def make_pool(self, num_blocks: int, enable_caching: bool) -> Any:
        return self._vllm.make_block_pool(num_blocks, enable_caching, BLOCK_SIZE)

    def make_manager(self, config: str, num_blocks: int) -> Any:
        return self._vllm.make_manager(
            self._groups[config],
            num_blocks,
            BLOCK_SIZE,
            enable_caching=True,
            max_model_len=PROMPT_TOKENS + DECODE_STEPS + BLOCK_SIZE,
        )

    def make_request(self, index: int) -> Any:
        return self._vllm.make_request(f"req-{index}", prompt_token_ids(index), BLOCK_SIZE)

    def free_block_ids(self, manager: Any) -> list[int]:
        return self._vllm.free_block_ids(manager.block_pool)


def load_vllm() -> tuple[VllmBackend | None, str]:
    """The vLLM backend, or ``None`` and the reason it could not be built."""
    try:
        return VllmBackend(), ""
    except Exception as exc:  # ImportError, or a broken install: run kvcore alone
        return None, f"{type(exc).__name__}: {exc}"


# -- the timed workloads (the same code drives both allocators) ---------------


def pool_cycles(pool: Any, n_blocks: int, n_cycles: int) -> None:
    get_new_blocks = pool.get_new_blocks
    free_blocks = pool.free_blocks
    for _ in range(n_cycles):
        blocks = get_new_blocks(n_blocks)
        free_blocks(reversed(blocks))


def lifecycle(manager: Any, requests: Sequence[Any], observe: Callable[[str, Any], None] | None = None) -> None:
    """Run ``requests`` batch by batch: prefix hit + prompt, decode steps, free.

    ``observe(step, value)`` (lockstep run only) receives the block ids of
    every hit, allocation, table and free queue.
    """
    for start in range(0, len(requests), BATCH_SIZE):
        running = requests[start : start + BATCH_SIZE]
        for req in running:
            hit = manager.get_computed_blocks(req)
            hit_blocks, hit_tokens = hit[0], hit[1]
            new_blocks = manager.allocate_slots(req, req.num_tokens - hit_tokens, hit_tokens, hit_blocks)
            if new_blocks is None:
                raise RuntimeError(f"{req.request_id}: prompt allocation refused; raise LIFECYCLE_NUM_BLOCKS")
            req.num_computed_tokens = req.num_tokens
            if observe is not None:
                observe(f"{req.request_id} get_computed_blocks", (hit_tokens, group_ids(hit_blocks)))
                observe(f"{req.request_id} allocate_slots(prompt)", group_ids(new_blocks))
        for step in range(DECODE_STEPS):
            for req in running:
                req.append_output_token_ids(OUTPUT_TOKEN)
                new_blocks = manager.allocate_slots(req, 1)
                if new_blocks is None:
                    raise RuntimeError(f"{req.request_id}: decode allocation refused; raise LIFECYCLE_NUM_BLOCKS")
                req.num_computed_tokens += 1
                if observe is not None:
                    observe(f"{req.request_id} allocate_slots(decode {step})", group_ids(new_blocks))
                    observe(f"{req.request_id} table after decode {step}", manager.get_block_ids(req.request_id))
        for req in running:
            manager.free(req)
            if observe is not None:
                observe(f"{req.request_id} free -> free queue", None)


def group_ids(blocks: Any) -> tuple[list[int], ...]:
    """Block ids per group of kvcore's tuple of lists or vLLM's ``KVCacheBlocks``."""
    return tuple([block.block_id for block in group] for group in getattr(blocks, "blocks", blocks))


# -- lockstep sanity check ----------------------------------------------------


def lockstep_trace(backend: Any, config: str) -> list[tuple[str, Any]]:
    manager = backend.make_manager(config, LOCKSTEP_NUM_BLOCKS)
    trace: list[tuple[str, Any]] = []

    def observe(step: str, value: Any) -> None:
        if value is None:  # a free: record the whole queue, head first
            value = backend.free_block_ids(manager)
        trace.append((step, value))

    lifecycle(manager, [backend.make_request(i) for i in range(LOCKSTEP_REQUESTS)], observe)
    return trace


def pool_trace(backend: Any, enable_caching: bool) -> list[tuple[str, Any]]:
    pool = backend.make_pool(64, enable_caching)
    trace = []
    for cycle, n_blocks in enumerate((5, 3, 7, 2)):
        blocks = pool.get_new_blocks(n_blocks)
        trace.append((f"cycle {cycle} get_new_blocks({n_blocks})", [block.block_id for block in blocks]))
        pool.free_blocks(reversed(blocks[1:]))  # keep the head block held: the next cycle reuses the others
        trace.append((f"cycle {cycle} free", None))
    return trace


def first_divergence(ours: list[tuple[str, Any]], theirs: list[tuple[str, Any]]) -> str | None:
    """The first step at which the two traces differ, described briefly; ``None`` if they agree."""
    for (step, mine), (_, other) in zip(ours, theirs):
        if mine != other:
            return f"step {step!r}: {describe_difference(mine, other)}"
    if len(ours) != len(theirs):
        return f"trace lengths differ: kvcore={len(ours)} vLLM={len(theirs)} steps"
    return None


def describe_difference(mine: Any, other: Any, where: str = "") -> str:
    """Where two id lists (or per-group tuples of them) first differ, with a few ids of context."""
    if isinstance(mine, tuple) and isinstance(other, tuple) and len(mine) == len(other):
        for index, (a, b) in enumerate(zip(mine, other)):
            if a != b:
                return describe_difference(a, b, f"{where}[{index}]")
    if isinstance(mine, list) and isinstance(other, list) and all(isinstance(x, int) for x in mine + other):
        index = next((i for i, (a, b) in enumerate(zip(mine, other)) if a != b), min(len(mine), len(other)))
        lo = max(0, index - 2)
        return (
            f"ids{where} differ from position {index} (lengths {len(mine)}/{len(other)}): "
            f"kvcore[{lo}:]={mine[lo : index + 4]} vLLM[{lo}:]={other[lo : index + 4]}"
        )
    return f"kvcore{where}={mine} vLLM{where}={other}"


def run_lockstep(vllm_backend: VllmBackend) -> dict[str, str | None]:
    kv = KvcoreBackend()
    results: dict[str, str | None] = {}
    for config in LIFECYCLE_CONFIGS:
        results[f"lifecycle {config}"] = first_divergence(
            lockstep_trace(kv, config), lockstep_trace(vllm_backend, config)
        )
    for caching in (True, False):
        results[f"pool caching {'on' if caching else 'off'}"] = first_divergence(
            pool_trace(kv, caching), pool_trace(vllm_backend, caching)
        )
    return results


# -- timing -------------------------------------------------------------------


def time_once(setup: Callable[[], Callable[[], None]]) -> float:
    """Seconds the callable returned by ``setup`` takes; ``setup`` runs outside the timed region."""
    run = setup()
    gc.collect()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def workloads(backend: Any, scale: float) -> list[tuple[str, str, int, Callable[[], Callable[[], None]]]]:
    """(name, unit, ops per repeat, setup) of every workload on ``backend``."""
    result = []
    n_cycles = max(1, int(POOL_CYCLES_PER_REPEAT * scale))
    for num_blocks, caching in POOL_CONFIGS:
        pool = backend.make_pool(num_blocks, caching)  # built once: a cycle leaves the pool as it found it

        def pool_setup(pool: Any = pool) -> Callable[[], None]:
            return lambda: pool_cycles(pool, POOL_CYCLE_BLOCKS, n_cycles)

        name = f"pool {num_blocks:,} blocks, caching {'on' if caching else 'off'}"
        result.append((name, f"cycles/s (get {POOL_CYCLE_BLOCKS} + free)", n_cycles, pool_setup))
    n_requests = max(BATCH_SIZE, int(LIFECYCLE_REQUESTS_PER_REPEAT * scale))
    for config in LIFECYCLE_CONFIGS:

        def lifecycle_setup(config: str = config) -> Callable[[], None]:
            manager = backend.make_manager(config, LIFECYCLE_NUM_BLOCKS)
            requests = [backend.make_request(i) for i in range(n_requests)]
            return lambda: lifecycle(manager, requests)

        label = "1 full" if config == "full" else "1 full + 2 sliding window"
        result.append((f"lifecycle {label}", "requests/s", n_requests, lifecycle_setup))
    return result


def measure(backends: Sequence[Any], repeats: int, scale: float) -> dict[str, dict[str, Any]]:
    """Ops per second of every repeat, per workload and backend.

    The backends' repeats alternate, so a change in machine load during a
    workload hits both figures alike.
    """
    figures: dict[str, dict[str, Any]] = {}
    per_backend = [workloads(backend, scale) for backend in backends]
    # Move everything alive now (vLLM's and torch's module state, the pools)
    # out of the collector's reach: a full collection would otherwise walk it
    # (~0.7 s with vLLM loaded) inside whichever timed repeat triggers it.
    gc.collect()
    gc.freeze()
    for rows in zip(*per_backend):
        name, unit, n_ops, _ = rows[0]
        rates: dict[str, list[float]] = {backend.name: [] for backend in backends}
        for _ in range(repeats):
            for backend, (_, _, _, setup) in zip(backends, rows):
                rates[backend.name].append(n_ops / time_once(setup))
        figures[name] = {"unit": unit, "ops_per_repeat": n_ops, "rates": rates}
    gc.unfreeze()
    return figures


# -- report -------------------------------------------------------------------


def summary(figures: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per workload: best and median ops/s per backend, and the ratio of the bests."""
    rows = []
    for name, figure in figures.items():
        kv = figure["rates"]["kvcore"]
        other = figure["rates"].get("vLLM")
        rows.append(
            {
                "workload": name,
                "unit": figure["unit"],
                "ops_per_repeat": figure["ops_per_repeat"],
                "kvcore_ops_per_s": max(kv),
                "kvcore_median_ops_per_s": statistics.median(kv),
                "vllm_ops_per_s": max(other) if other else None,
                "vllm_median_ops_per_s": statistics.median(other) if other else None,
                "ratio": max(kv) / max(other) if other else None,
                "median_ratio": statistics.median(kv) / statistics.median(other) if other else None,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'workload':<36} {'unit':<26} {'kvcore ops/s':>13} {'vLLM ops/s':>13} {'kvcore/vLLM':>12} {'(median)':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        vllm_text = f"{'-':>13}" if row["ratio"] is None else f"{row['vllm_ops_per_s']:>13,.0f}"
        ratio_text = (
            f"{'-':>12} {'-':>9}" if row["ratio"] is None else f"{row['ratio']:>12.2f} {row['median_ratio']:>9.2f}"
        )
        print(f"{row['workload']:<36} {row['unit']:<26} {row['kvcore_ops_per_s']:>13,.0f} {vllm_text} {ratio_text}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per figure (best is reported)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the ops per repeat")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--no-vllm", action="store_true", help="run kvcore alone")
    parser.add_argument("--write", default=None, help="also write the report as Markdown to this file")
    args = parser.parse_args(argv)
    with recorded_output(args.write, "Allocator speed: kvcore and vLLM", "bench_allocators.py"):
        return measure_and_print(args)


def measure_and_print(args: argparse.Namespace) -> int:

    vllm_backend, reason = (None, "--no-vllm") if args.no_vllm else load_vllm()
    if vllm_backend is None:
        print(f"vLLM not available ({reason}); measuring kvcore alone, Python {platform.python_version()}")
        lockstep: dict[str, str | None] = {}
    else:
        print(f"vLLM {vllm_backend.version}, Python {platform.python_version()}")
        lockstep = run_lockstep(vllm_backend)
        for name, divergence in lockstep.items():
            if divergence is None:
                print(f"lockstep {name}: same block ids")
            else:
                print(f"WARNING: lockstep {name}: block ids differ at {divergence}")
    print()

    backends: list[Any] = [KvcoreBackend()] if vllm_backend is None else [KvcoreBackend(), vllm_backend]
    figures = measure(backends, args.repeats, args.scale)
    rows = summary(figures)
    print_table(rows)

    if args.json:
        report = {
            "python": platform.python_version(),
            "vllm_version": vllm_backend.version if vllm_backend is not None else None,
            "repeats": args.repeats,
            "scale": args.scale,
            "lockstep_divergence": lockstep,
            "workloads": rows,
            "samples_ops_per_s": {name: figure["rates"] for name, figure in figures.items()},
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
