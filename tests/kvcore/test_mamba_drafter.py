"""An EAGLE drafter beside an align-mode Mamba group: the attention groups holding the drafter drop their
last hit block, the Mamba group looks no further than the candidate and drops nothing (a draft model has
no Mamba layers), and its prefill checkpoints and the prompt's reusable state sit a hit boundary lower,
where the attention groups' hits land.

The expected tables, cache entries and hits are the ones vLLM 0.33.0 produces for the same steps
(``tests/vllm/test_vllm_mamba_drafter.py`` runs them there).
"""

from __future__ import annotations

import pytest

from kvcore import FullAttentionSpec, KVCacheConfig, KVCacheManager, MambaSpec, Request
from tests.kvcore.test_prefill_checkpoints import cached_keys, schedule

CHECKPOINTED = MambaSpec(2, cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)


def drafter_config(use_eagle: bool) -> KVCacheConfig:
    """Full attention (the drafter's group when ``use_eagle``) beside checkpointed Mamba states, 2-token
    blocks."""
    return KVCacheConfig(
        32, [FullAttentionSpec(2), CHECKPOINTED], use_eagle=use_eagle, eagle_group_ids=(0,) if use_eagle else ()
    )


@pytest.mark.parametrize(("use_eagle", "checkpoint", "hit"), [(False, 10, 10), (True, 8, 8)])
def test_the_checkpoint_sits_where_the_drafters_hits_land(use_eagle: bool, checkpoint: int, hit: int) -> None:
    """An 11-token prompt in one chunk keeps its checkpoint in position 4 (the block before its last
    state's): the state after 10 tokens without a drafter, after 8 with one.  A request sharing 10 tokens
    then hits 10 tokens without the drafter; with it, full attention drops its fifth block and the Mamba
    group finds the checkpoint at 8, held at that boundary's position (3)."""
    manager = KVCacheManager(drafter_config(use_eagle))
    first = Request("a", list(range(11)), 2)
    schedule(manager, first, 11)
    mamba_table = manager.get_block_ids("a")[1]
    assert mamba_table == [0, 0, 0, 0, 7, 8]
    assert cached_keys(manager, 1)[7] == first.block_hashes[checkpoint // 2 - 1]
    manager.free(first)
    second = Request("b", [*range(10), 50, 51], 2)
    assert schedule(manager, second, 12 - hit) == hit
    assert manager.get_block_ids("b")[1][hit // 2 - 1] == 7
    manager.check_invariants()


def test_the_mamba_lookup_takes_no_look_past_the_candidate() -> None:
    """A drafter named in no group is in every group, the Mamba group's too, whose lookup still looks no
    further than the candidate.  States cached after 4 and 6 tokens: a request sharing 6 tokens (7 in
    all) gets full attention's hit cut to 4 by the drop, and the Mamba group's state after 4 (not 6, a
    block past the candidate, which it would find if it looked as far as full attention does)."""
    manager = KVCacheManager(KVCacheConfig(32, [FullAttentionSpec(2), CHECKPOINTED], use_eagle=True))
    first = Request("a", list(range(8)), 2)
    for chunk in (4, 2, 2):
        schedule(manager, first, chunk)
    manager.free(first)
    assert schedule(manager, Request("b", [*range(6), 70], 2), 3) == 4
    manager.check_invariants()


@pytest.mark.parametrize(("use_eagle", "hit"), [(False, 12), (True, 10)])
def test_a_drafter_with_sub_block_hits_drops_one_hash_unit(use_eagle: bool, hit: int) -> None:
    """4-token blocks hashed every 2 tokens (sub-block hits).  A 12-token prompt in chunks ending at 8, 10
    and 12: the state after 10 tokens, inside the third state block, is cached and copied to a block the
    cache keeps as the request writes on.  A request sharing all 12 tokens then hits 12 without a drafter.
    With one, full attention finds its three blocks and drops one hash unit, not a block: the hit (10)
    ends inside its third block, on the Mamba group's copied state.  The next allocation copies both
    shared blocks the hit ends inside to blocks of the request's own (copy on write)."""
    config = KVCacheConfig(
        32,
        [FullAttentionSpec(4), MambaSpec(4, cache_mode="align")],
        use_eagle=use_eagle,
        eagle_group_ids=(0,) if use_eagle else (),
        hash_block_size=2,
    )
    manager = KVCacheManager(config)
    first = Request("a", list(range(12)), 2)
    for chunk in (4, 4, 2, 2):
        schedule(manager, first, chunk)
    full, states = manager.get_block_ids("a")
    (state_copy,), retained = manager.take_block_copies()
    assert state_copy[0] == states[2]
    manager.free_retained_blocks(retained)
    manager.free(first)
    second = Request("b", [*range(12), 50, 51], 2)
    hit_blocks, hit_length = manager.get_computed_blocks(second)
    assert hit_length == hit
    assert [block.block_id for block in hit_blocks[0]] == full
    assert hit_blocks[1][2].block_id == (states[2] if hit == 12 else state_copy[1])
    assert manager.allocate_slots(second, 14 - hit, hit, hit_blocks) is not None
    copies, _ = manager.take_block_copies()
    assert [source for source, _ in copies] == ([full[2], state_copy[1]] if use_eagle else [])
    manager.check_invariants()


@pytest.mark.parametrize(("enabled", "sibling_hit"), [(False, 0), (True, 6)])
def test_a_shared_prefix_checkpoint_caches_the_state_at_the_junction(enabled: bool, sibling_hit: int) -> None:
    """4-token blocks hashed every 2 tokens, a drafter in the full-attention group.  b shares 10 of a's 16
    tokens: full attention finds 8, less the drafter's hash block, 6, where the Mamba group has no state
    (a computed its first 12 tokens in one chunk), so b hits nothing and records the junction at 6.  Its
    first chunk ends there (the scheduler's stop); with ``enable_mamba_shared_prefix_checkpoint`` the
    state after 6 tokens, inside b's second state block, is cached, and c, sharing 8 tokens, resumes
    from it."""
    config = KVCacheConfig(
        32,
        [FullAttentionSpec(4), MambaSpec(4, cache_mode="align")],
        use_eagle=True,
        eagle_group_ids=(0,),
        hash_block_size=2,
        enable_mamba_shared_prefix_checkpoint=enabled,
    )
    assert config.shared_prefix_checkpoint == enabled
    manager = KVCacheManager(config)
    first = Request("a", list(range(16)), 2)
    for chunk in (12, 2, 2):
        schedule(manager, first, chunk)
    manager.free_retained_blocks(manager.take_block_copies()[1])
    manager.free(first)
    second = Request("b", [*range(10), *[90] * 6], 2)
    assert schedule(manager, second, 6) == 0
    assert second.shared_prefix_boundary == 6
    state = manager.get_block_ids("b")[1][1]
    hit_blocks, hit_length = manager.get_computed_blocks(Request("c", [*range(8), *[70] * 6], 2))
    assert hit_length == sibling_hit
    if enabled:
        assert hit_blocks[1][1].block_id == state
    manager.check_invariants()


@pytest.mark.parametrize(
    "changes",
    [
        {"use_eagle": False, "eagle_group_ids": ()},
        {"hash_block_size": 4},
        {"num_prefill_lookahead": 2},
    ],
)
def test_a_shared_prefix_checkpoint_is_in_force_only_as_vllm_narrows_it(changes: dict[str, object]) -> None:
    """The flag takes effect only with a drafter's groups, sub-block hits and no tokens a drafter prefills
    again (vLLM 0.33.0's ``KVCacheManager.mamba_shared_prefix_checkpoint``)."""
    settings: dict[str, object] = {
        "use_eagle": True,
        "eagle_group_ids": (0,),
        "hash_block_size": 2,
        "enable_mamba_shared_prefix_checkpoint": True,
        **changes,
    }
    config = KVCacheConfig(32, [FullAttentionSpec(4), MambaSpec(4, cache_mode="align")], **settings)  # type: ignore[arg-type]
    assert not config.shared_prefix_checkpoint
