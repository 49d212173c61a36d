"""Speculative decode steps beside an align-mode Mamba group.

A step schedules the request's last token and its drafts; the verifier
rejects some of them, and the scheduler rolls its computed tokens back.  The
allocator never learns of the rollback: the table keeps ending where the
drafts ended, the state block it records there is freed only once the
processed tokens pass it.  The expected tables are the ones vLLM 0.33.0
produces for the same steps.
"""

from __future__ import annotations

from kvcore import KVCacheConfig, KVCacheManager, MambaSpec, Request


def make_manager(block_size: int = 1, num_blocks: int = 12) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig(num_blocks=num_blocks, groups=(MambaSpec(block_size, cache_mode="align"),)))


def table(manager: KVCacheManager, request: Request) -> list[int]:
    return [block.block_id for block in manager.get_blocks(request.request_id)[0]]


def speculative_step(manager: KVCacheManager, request: Request, num_drafts: int, num_accepted: int) -> list[int]:
    """The last token and ``num_drafts`` drafts scheduled; ``num_accepted`` of them kept, and a bonus
    token.  Returns the new blocks' ids."""
    new_blocks = manager.allocate_slots(request, 1 + num_drafts)
    assert new_blocks is not None
    request.num_computed_tokens += 1 + num_accepted
    for _ in range(num_accepted + 1):
        request.append_output_token_ids(0)
    manager.new_step_starts()
    return [block.block_id for block in new_blocks[0] if not block.is_null]


def decoding_request(manager: KVCacheManager) -> Request:
    """A 1-token prompt computed, its sampled token appended: ready for a speculative step."""
    request = Request("a", [0], 1)
    assert manager.allocate_slots(request, 1) is not None
    request.num_computed_tokens = 1
    request.append_output_token_ids(0)
    return request


def test_rejected_drafts_leave_the_table_ending_where_they_ended() -> None:
    """3 drafts, 2 accepted: 4 tokens computed, but the table reaches the drafts' end at 5 tokens, its new
    state block at position 4 after null padding; the first state stays, as the one the step copies from."""
    manager = make_manager()
    request = decoding_request(manager)
    (first,) = table(manager, request)
    (new,) = speculative_step(manager, request, 3, 2)
    assert request.num_computed_tokens == 4
    assert table(manager, request) == [first, 0, 0, 0, new]


def test_a_recorded_state_waits_until_the_processed_tokens_pass_it() -> None:
    """After a rejected draft the table runs one position past the computed tokens, so the next step's
    recorded state is not yet behind them: three states are live until a later step frees two."""
    manager = make_manager()
    request = decoding_request(manager)
    speculative_step(manager, request, 3, 2)  # computed 4, table to 5
    (second,) = speculative_step(manager, request, 1, 0)  # computed 5, table to 6; the first state freed
    (third,) = speculative_step(manager, request, 1, 1)  # computed 7, table to 7
    state_before = table(manager, request)[4]
    assert table(manager, request) == [0, 0, 0, 0, state_before, second, third]
    (fourth,) = speculative_step(manager, request, 1, 1)  # computed 9, table to 9
    assert table(manager, request) == [0, 0, 0, 0, 0, 0, third, 0, fourth]


def test_a_step_ending_short_of_the_drafts_end_gets_no_block_where_its_state_goes() -> None:
    """As in vLLM 0.33.0: 2 drafts rejected leave the table at 4 positions with 2 tokens computed; a step
    without drafts ends after token 3, whose state the model runner saves at position 2, but the table
    is long enough, so nothing is allocated and position 2 holds the null block (kvcheck runs no such
    step: ``kvmodel.step_plans.ends_short_of_its_state``)."""
    manager = make_manager()
    request = decoding_request(manager)
    (new,) = speculative_step(manager, request, 2, 0)
    assert request.num_computed_tokens == 2 and table(manager, request)[1:] == [0, 0, new]
    blocks = manager.allocate_slots(request, 1)
    assert blocks is not None and not any(block for group in blocks for block in group if not block.is_null)
    assert table(manager, request)[2] == 0
