"""Prefill checkpoints of an align-mode Mamba group (``num_prefill_checkpoint_blocks``): a chunk whose
backend exports a state inside it keeps that state in the block before its last state's position.

The expected tables, cache entries and hits are the ones vLLM 0.33.0 produces for the same steps
(``tests/vllm/test_vllm_prefill_checkpoints.py`` runs them there).
"""

from __future__ import annotations

import pytest

from kvcore import FullAttentionSpec, InvalidConfig, KVCacheConfig, KVCacheManager, MambaSpec, Request

CHECKPOINTED = MambaSpec(4, cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)


def schedule(manager: KVCacheManager, request: Request, num_new_tokens: int) -> int:
    """One step of ``request`` (its hit first when it holds no blocks); the hit length."""
    hit_blocks, hit_length = None, 0
    if request.request_id not in manager.request_ids():
        hit_blocks, hit_length = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, num_new_tokens, hit_length, hit_blocks) is not None
    request.num_computed_tokens += hit_length + num_new_tokens
    manager.new_step_starts()
    return hit_length


def cached_keys(manager: KVCacheManager, group_id: int) -> dict[int, list[int]]:
    """Block id -> the block hash it is cached under in group ``group_id`` (one key per block here)."""
    return {block_id: key for (key, group), block_id in manager.block_pool.cache_entries() if group == group_id}


@pytest.mark.parametrize(
    ("spec", "table", "hit"), [(CHECKPOINTED, [0, 1, 2], 8), (MambaSpec(4, cache_mode="align"), [0, 0, 1], 0)]
)
def test_a_prefill_keeps_its_checkpoint_for_a_later_hit(spec: MambaSpec, table: list[int], hit: int) -> None:
    """A 10-token prompt in one chunk: with a checkpoint block the state after 8 tokens (the last block
    boundary short of the last token) stays in the block before the last state's, cached, and a later
    request sharing 8 tokens hits it; without, that position is null and nothing is hit."""
    manager = KVCacheManager(KVCacheConfig(16, [spec]))
    schedule(manager, Request("a", list(range(10)), 4), 10)
    assert manager.get_block_ids("a") == (table,)
    manager.free(Request("a", list(range(10)), 4))
    later = Request("b", [*range(8), 97, 98, 99], 4)
    assert schedule(manager, later, 11 - hit) == hit
    manager.check_invariants()


def test_a_transient_checkpoint_loses_its_key_and_the_prompts_is_hit_inside_a_block() -> None:
    """Mamba blocks of 4 tokens beside full attention's of 2, hashed every 2 (sub-block hits).  A first
    chunk of 8 keeps the state after 6 in position 0: neither a block boundary nor the prompt's
    checkpoint, it is transient and loses the full key position 0 was cached under.  The last chunk
    keeps the state after 18 (the prompt's checkpoint) in position 3, under the 18-token key in place of
    its 16-token one; a request sharing 18 tokens hits it there, inside its block, and copies it."""
    manager = KVCacheManager(KVCacheConfig(32, [FullAttentionSpec(2), CHECKPOINTED], hash_block_size=2))
    prompt = list(range(1, 21))
    a = Request("a", prompt, 2)
    hashes = a.block_hashes  # one per 2 tokens: the key of the state after 2 * (i + 1) tokens is hashes[i]
    schedule(manager, a, 8)
    assert manager.get_block_ids("a")[1] == [5, 6]
    assert cached_keys(manager, 1) == {6: hashes[3]}
    schedule(manager, a, 12)
    assert manager.get_block_ids("a")[1] == [0, 6, 0, 12, 13]
    assert cached_keys(manager, 1) == {6: hashes[3], 12: hashes[8], 13: hashes[9]}
    manager.free(a)
    b = Request("b", [*prompt[:18], 50, 51], 2)
    assert schedule(manager, b, 2) == 18
    assert manager.get_block_ids("b")[1] == [0, 0, 0, 0, 15]
    copies, endpoints = manager.take_block_copies()
    assert copies == [(12, 15)]
    manager.free_retained_blocks(endpoints)
    manager.check_invariants()


@pytest.mark.parametrize(
    ("field", "value"), [("num_prefill_checkpoint_blocks", -1), ("prefill_checkpoint_alignment", 0)]
)
def test_checkpoint_fields_out_of_range_are_refused_by_name(field: str, value: int) -> None:
    with pytest.raises(InvalidConfig) as refused:
        MambaSpec(4, cache_mode="align", **{field: value})
    assert refused.value.field == field


def test_the_none_mode_ignores_checkpoint_blocks() -> None:
    """Outside the align mode the fields are accepted and change nothing (vLLM 0.33.0 reads them in the
    align mode only)."""
    spec = MambaSpec(4, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
    assert not spec.has_prefill_checkpoints
    tables = []
    for group in (spec, MambaSpec(4)):
        manager = KVCacheManager(KVCacheConfig(16, [group], enable_caching=False))
        request = Request("a", list(range(10)), 4)
        schedule(manager, request, 8)
        schedule(manager, request, 2)
        tables.append(manager.get_block_ids("a"))
    assert tables[0] == tables[1] == ([0, 2, 1],)


def test_a_checkpoint_past_the_hashes_is_kept_uncached() -> None:
    """A step reaching a token still being sampled (async scheduling) places its checkpoint past the
    request's hashes: an 8-token request with hashes looking 1 token ahead (7 hashes) computes 7 tokens,
    then 2; the state after 8 tokens has no key, so its block (position 7) stays uncached, as a transient
    checkpoint's (vLLM 0.33.0 asserts there)."""
    manager = KVCacheManager(
        KVCacheConfig(
            16, [MambaSpec(1, cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)]
        )
    )
    request = Request("a", list(range(8)), 1, num_hash_lookahead_tokens=1)
    assert len(request.block_hashes) == 7
    schedule(manager, request, 7)
    assert manager.allocate_slots(request, 2) is not None
    checkpoint = manager.coordinator.managers[0].req_to_blocks["a"][7]
    assert not checkpoint.is_null and checkpoint.block_hash is None
    manager.check_invariants()
