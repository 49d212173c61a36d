"""vLLM's free queue and block pool as targets of the component machines: faithful, and able to fail.

Runs only where vLLM imports; skipped in the default set-up.  The
machines themselves run on vLLM with ``pytest stateful_tests --target vllm``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.faults import VLLM_FAULTS
from kvcheck.stateful_tests.block_pool_machine import block_pool_machine
from kvcheck.targets import load_pool, load_queue
from kvcheck.targets.vllm_pool import VllmPool
from kvcheck.targets.vllm_queue import VllmQueue

SEARCH = settings(
    derandomize=True, database=None, max_examples=200, deadline=None, suppress_health_check=list(HealthCheck)
)


def test_built_in_names_load_the_vllm_targets() -> None:
    assert load_queue("vllm") is VllmQueue
    assert load_pool("vllm") is VllmPool


def test_queue_refuses_more_than_free_and_changes_nothing() -> None:
    queue = VllmQueue(3)
    assert queue.popleft_n(2) == [1, 2]
    assert queue.popleft_n(2) is None
    assert (queue.ids(), queue.ids_from_tail(), queue.num_free) == ([3], [3], 1)
    queue.check_internal()


def test_queue_self_check_names_a_broken_link() -> None:
    queue = VllmQueue(3)
    queue.blocks[2].prev_free_block = queue.blocks[3]
    with pytest.raises(AssertionError, match=r"link mismatch: 1.next=2 but 2.prev=3"):
        queue.check_internal()


def test_pool_caches_through_cache_full_blocks_and_reuses_in_lru_order() -> None:
    pool = VllmPool(5, enable_caching=True)
    assert pool.get_new_blocks(3) == [1, 2, 3]
    pool.cache([1, 2], [7, 8], group_id=1)
    assert pool.cache_entries() == {(1, 7, 1), (1, 8, 2)}
    assert pool.lookup(8, 1) == 2 and pool.lookup(8, 0) is None
    pool.free([3, 2, 1])
    # The uncached block goes to the head, the cached ones to the tail in eviction order.
    assert pool.free_order() == [3, 4, 2, 1]
    assert pool.get_new_blocks(6) is None
    assert pool.free_order() == [3, 4, 2, 1] and pool.num_free == 4
    assert pool.reset() and pool.cache_entries() == frozenset()
    pool.check_internal()


class PoolWithSeed000(VllmPool):
    """vLLM's pool with the seed-000 free_blocks (FIFO reuse while caching is off) patched on."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        super().__init__(num_blocks, enable_caching)
        VLLM_FAULTS["fifo-reuse-when-caching-off"].plant(SimpleNamespace(block_pool=self.pool))


def test_block_pool_machine_catches_seed_000_in_vllms_pool() -> None:
    with pytest.raises(AssertionError, match="free order diverged"):
        run_state_machine_as_test(block_pool_machine(PoolWithSeed000), settings=SEARCH)
