"""kvcheck's trace shrinker: passes that cut a request's token-by-token growth."""

from __future__ import annotations

from kvcheck.replay import resolve_target
from kvcheck.shrink import replay_violation, shrink
from kvcheck.swarm import Failure
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.ops import AddRequest, Schedule, SpecDecode

RING_AND_CHUNK = TargetConfig(
    num_blocks=10,
    block_size=1,
    groups=(GroupSpec(kind="ring"), GroupSpec(kind="chunked_local", window=6)),
    enable_caching=True,
)
GROWN_ONE_TOKEN_AT_A_TIME = (
    AddRequest("r0", (0,)),
    Schedule("r0", 1),
    SpecDecode("r0", num_draft_tokens=1, num_accepted_tokens=1),
    *(Schedule("r0", 1) for _ in range(10)),
    AddRequest("r1", (0, 0, 0)),
    Schedule("r1", 1, 1),
)


def test_a_request_grown_token_by_token_is_folded_into_a_longer_prompt() -> None:
    """The cross-group double allocation of a ring buffer beside chunked-local attention shows once a
    request's first chunk has left its window: grown one token at a time it takes 15 steps; the
    shrinker folds the first decodes into the prompt (6 tokens computed in one step), which takes 11."""
    make_target = resolve_target("kvcore", "interleaved-external-alloc")
    found = replay_violation(make_target, RING_AND_CHUNK, GROWN_ONE_TOKEN_AT_A_TIME)
    assert found is not None and found.invariant == "no_duplicate_block_ids" and found.step == 15
    shrunk = shrink(make_target, Failure(RING_AND_CHUNK, GROWN_ONE_TOKEN_AT_A_TIME, found))
    assert shrunk.violation.invariant == "no_duplicate_block_ids"
    assert shrunk.ops[:2] == (AddRequest("r0", (0,) * 6), Schedule("r0", 6))
    assert len(shrunk.ops) == 11


def test_steps_that_only_held_blocks_go_with_as_many_blocks_of_the_pool() -> None:
    """Dropping decode steps alone leaves free blocks the failure needed gone; dropped with as many
    blocks of the pool, the failure stays."""
    make_target = resolve_target("kvcore", "interleaved-external-alloc")
    bigger = TargetConfig(num_blocks=13, block_size=1, groups=RING_AND_CHUNK.groups, enable_caching=True)
    ops = (
        AddRequest("r0", (0,) * 6),
        Schedule("r0", 6),
        *(Schedule("r0", 1) for _ in range(10)),
        AddRequest("r1", (0, 0, 0)),
        Schedule("r1", 1, 1),
    )
    found = replay_violation(make_target, bigger, ops)
    assert found is not None and found.invariant == "no_duplicate_block_ids"
    shrunk = shrink(make_target, Failure(bigger, ops, found))
    assert (shrunk.config.num_blocks, len(shrunk.ops)) == (10, 11)
