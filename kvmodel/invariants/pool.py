"""The invariants of the block pool: every block held or free once, reference counts, the free queue and the order
blocks are reused in."""

from __future__ import annotations

from collections import Counter

from kvmodel.invariants.check import StepCheck, fail


def no_duplicate_block_ids(check: StepCheck) -> None:
    """No table holds a block twice, no block serves two groups, and two requests share a block
    only at the same block position (as a prefix hit shares it), but in an align-mode Mamba group with
    prefill checkpoints: there a checkpoint's block holds the state at a hit boundary inside an earlier
    block than its own position, and a later request's hit on that boundary places it at the boundary's
    position.

    Guards: cross-group double allocation (seed 003: one group's external
    allocation popping another group's untouched hit block)."""
    checkpoint_groups = {
        group_id
        for group_id, group in enumerate(check.config.groups)
        if group.rules.aligned_states and group.prefill_checkpoint_alignment is not None
    }
    group_of: dict[int, int] = {}
    position_of: dict[int, tuple[int, str]] = {}
    for request_id, groups in check.sut.tables.items():
        for group_id, table in enumerate(groups):
            held = [b for b in table if b != 0]
            repeated = sorted(b for b, n in Counter(held).items() if n > 1)
            if repeated:
                fail(
                    check,
                    "no_duplicate_block_ids",
                    f"request {request_id} group {group_id} holds block {repeated[0]} twice: table {list(table)}",
                )
            for position, block_id in enumerate(table):
                if block_id == 0:
                    continue
                other_group = group_of.setdefault(block_id, group_id)
                if other_group != group_id:
                    fail(
                        check,
                        "no_duplicate_block_ids",
                        f"block {block_id} is held in group {other_group} "
                        f"and in group {group_id} (request {request_id})",
                    )
                other_position, other_request = position_of.setdefault(block_id, (position, request_id))
                if other_position != position and group_id not in checkpoint_groups:
                    fail(
                        check,
                        "no_duplicate_block_ids",
                        f"block {block_id} is block {other_position} of "
                        f"{other_request} and block {position} of {request_id}: not a shared prefix",
                    )


def ref_cnt_matches_holders(check: StepCheck) -> None:
    """Every block's ref_cnt equals the number of table slots, over all requests and groups, that hold it
    (plus the deferred frees that still hold it).

    Guards: double touch or missed touch of a hit block; a free that drops
    the wrong count (seed 003's ref-count corruption)."""
    holders = Counter(b for groups in check.sut.tables.values() for table in groups for b in table if b != 0)
    holders.update(b for popped in check.sut.deferred_frees for b in popped if b != 0)
    for block_id, ref_cnt in sorted(check.sut.ref_counts.items()):
        if ref_cnt != holders.get(block_id, 0):
            fail(
                check,
                "ref_cnt_matches_holders",
                f"block {block_id} ref_cnt differs from its holder count",
                holders.get(block_id, 0),
                ref_cnt,
            )


def free_queue_well_formed(check: StepCheck) -> None:
    """The free queue's forward and backward links agree, its count is right, and every block
    is either in it (ref_cnt 0) or held, never both and never neither; the null block is never in it.

    Guards: a linked-list splice that loses or duplicates a node; touch not
    taking a free hit block out of the queue."""
    sut = check.sut
    forward, backward = list(sut.free_order), list(sut.free_order_backward)
    if forward != backward[::-1]:
        fail(check, "free_queue_well_formed", "forward and backward walks disagree", forward, backward[::-1])
    if len(forward) != sut.num_free:
        fail(check, "free_queue_well_formed", "num_free differs from the queue length", len(forward), sut.num_free)
    repeated = sorted(b for b, n in Counter(forward).items() if n > 1)
    if repeated:
        fail(check, "free_queue_well_formed", f"block {repeated[0]} is in the queue twice", None, forward)
    if 0 in forward:
        fail(check, "free_queue_well_formed", "the null block is in the free queue", None, forward)
    queued = set(forward)
    for block_id, ref_cnt in sorted(sut.ref_counts.items()):
        if (ref_cnt == 0) != (block_id in queued):
            where = "in the free queue" if block_id in queued else "not in the free queue"
            fail(check, "free_queue_well_formed", f"block {block_id} has ref_cnt {ref_cnt} and is {where}")


def failed_allocation_changes_nothing(check: StepCheck) -> None:
    """A refused allocate_slots leaves pool, tables, ref counts and cache as before
    (apart from releasing blocks that had already left the attention window).

    Guards: a refused allocation that leaks a popped block or a touched hit."""
    if check.sut_result.admitted is not False:
        return
    for field in ("free_order", "tables", "ref_counts", "cache_entries"):
        expected, actual = getattr(check.model, field), getattr(check.sut, field)
        if expected != actual:
            fail(
                check, "failed_allocation_changes_nothing", f"{field} changed by a refused allocation", expected, actual
            )


def _same_reuse_order(check: StepCheck, invariant: str) -> None:
    if check.sut_result.new_block_ids != check.model_result.new_block_ids:
        fail(
            check,
            invariant,
            "newly allocated blocks differ",
            check.model_result.new_block_ids,
            check.sut_result.new_block_ids,
        )
    if check.sut.free_order != check.model.free_order:
        fail(check, invariant, "free queue order differs", list(check.model.free_order), list(check.sut.free_order))


def lifo_head_reuse_when_caching_off(check: StepCheck) -> None:
    """With caching off, freed blocks go to the head of the queue, so the blocks handed out next
    are the most recently freed ones, in reverse free order.

    Guards: the FIFO/LIFO flip (seed 000: ``hash is None and caching_on``
    written for ``hash is None or not caching_on`` in free_blocks)."""
    if not check.config.enable_caching:
        _same_reuse_order(check, "lifo_head_reuse_when_caching_off")


def lru_eviction_when_caching_on(check: StepCheck) -> None:
    """With caching on, the free queue is: uncached blocks at the head (most recently freed
    first), cached blocks at the tail in least-recently-freed order, each request tail block first.

    Guards: a free that does not reverse a request's blocks; cached blocks
    freed to the head (evicting a hot prefix first)."""
    if check.config.enable_caching:
        _same_reuse_order(check, "lru_eviction_when_caching_on")


def reset_refused_only_while_held(check: StepCheck) -> None:
    """reset_prefix_cache succeeds exactly when no block is held.

    Guards: a reset that drops the hashes of blocks still in use."""
    if check.sut_result.reset_done != check.model_result.reset_done:
        fail(
            check,
            "reset_refused_only_while_held",
            "reset result differs",
            check.model_result.reset_done,
            check.sut_result.reset_done,
        )
