"""Operations: what a state machine, a trace or a driver asks a target to do.

Operations are plain frozen values.  A target adapter and the reference model
both interpret them; traces store them as JSON.  What a step adopts and computes
for an operation is in :mod:`kvmodel.step_plans`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from kvmodel.config_checks import int_tuple

if TYPE_CHECKING:
    pass

GroupIds = tuple[tuple[int, ...], ...]
"""Block ids per KV-cache group."""


@attrs.frozen
class AddRequest:
    """A request arrives with ``prompt`` token ids and waits to be scheduled."""

    name: ClassVar[str] = "add_request"
    request_id: str
    prompt: tuple[int, ...] = attrs.field(converter=int_tuple)


@attrs.frozen
class Schedule:
    """One scheduler step for a request.

    A waiting request first takes its local prefix hit, then up to
    ``num_external_tokens`` tokens loaded by an external connector, then up to
    ``num_new_tokens`` tokens to compute.  A running request computes up to
    ``num_new_tokens`` more.  When the step computes the request's last token,
    ``sampled_token`` is appended as its output.  Under async scheduling the
    step goes in flight and its output waits for :class:`ProcessOutput`
    (with two steps in flight already, the oldest output is processed
    first, as the engine waits for it); a running request may then compute
    the tokens its steps in flight will sample.

    With ``same_step`` the request joins the scheduler step of the operation
    before it (vLLM's ``schedule()`` admitting several requests in one pass):
    no new step starts, so a Mamba state another request cached in this step
    cannot be hit yet (only with synchronous scheduling).
    """

    name: ClassVar[str] = "schedule"
    request_id: str
    num_new_tokens: int
    num_external_tokens: int = 0
    sampled_token: int = 0
    same_step: bool = False


@attrs.frozen
class SpecDecode:
    """A speculative decode step of a running request at its last token.

    The drafter proposed ``num_draft_tokens`` tokens; the step computes the
    last token and the drafts (``1 + num_draft_tokens`` slots, plus the
    configuration's lookahead), then the verifier accepts the first
    ``num_accepted_tokens`` drafts (at most all of them): the rejected ones
    are rolled back from ``num_computed_tokens``, and the accepted ones plus
    one bonus token, each ``sampled_token``, are appended.  For a request
    that is not running at its last token the step does nothing.
    """

    name: ClassVar[str] = "spec_decode"
    request_id: str
    num_draft_tokens: int
    num_accepted_tokens: int
    sampled_token: int = 0


@attrs.frozen
class ProcessOutput:
    """The output of the oldest step still in flight is processed (async scheduling only).

    Its tokens leave the request's in-flight count; a step that computed the
    request's last known token appends its sampled token; a request that
    was preempted or finished meanwhile gets no counter update (its output
    is stale) and a finished one nothing at all.  Then blocks whose deferred
    free waited for this step return to the pool.  A no-op when no step is
    in flight.
    """

    name: ClassVar[str] = "process_output"


@attrs.frozen
class StartAsyncLoad:
    """A waiting request takes its local hit and an external connector starts loading up to
    ``num_external_tokens`` more tokens asynchronously.

    The slots are allocated now with ``delay_cache_blocks``: the loaded
    blocks enter the prefix cache only at :class:`FinishAsyncLoad`.  Nothing
    is computed, and the request cannot be scheduled until the load
    finishes.  A no-op for a request that is running or loading, or when no
    token is left to load below the last one.
    """

    name: ClassVar[str] = "start_async_load"
    request_id: str
    num_external_tokens: int


@attrs.frozen
class FinishAsyncLoad:
    """The request's asynchronous load landed: its computed blocks are cached, and it is scheduled
    like a running request from then on.  A no-op for a request that is not loading."""

    name: ClassVar[str] = "finish_async_load"
    request_id: str


@attrs.frozen
class Finish:
    """The request ends: all its blocks are freed (a no-op for one that holds none)."""

    name: ClassVar[str] = "finish"
    request_id: str


@attrs.frozen
class Preempt:
    """The request is preempted: its blocks are freed and it will recompute from token 0."""

    name: ClassVar[str] = "preempt"
    request_id: str


@attrs.frozen
class FailedLoad:
    """An external KV load for the request failed: its blocks leave the prefix cache,
    then it is preempted to recompute from token 0."""

    name: ClassVar[str] = "failed_load"
    request_id: str


@attrs.frozen
class EvictBlocks:
    """Drop the prefix-cache entries of the given blocks (held blocks stay allocated)."""

    name: ClassVar[str] = "evict_blocks"
    block_ids: tuple[int, ...] = attrs.field(converter=int_tuple)


@attrs.frozen
class ResetPrefixCache:
    """Empty the prefix cache; refused while any block is held."""

    name: ClassVar[str] = "reset_prefix_cache"


Operation = (
    AddRequest
    | Schedule
    | SpecDecode
    | ProcessOutput
    | StartAsyncLoad
    | FinishAsyncLoad
    | Finish
    | Preempt
    | FailedLoad
    | EvictBlocks
    | ResetPrefixCache
)

REQUEST_OPERATIONS = (Schedule, SpecDecode, StartAsyncLoad, FinishAsyncLoad, Finish, Preempt, FailedLoad)
"""Operations on one request, named by ``request_id``."""

OPERATION_TYPES: dict[str, type[Operation]] = {
    cls.name: cls
    for cls in (
        AddRequest,
        Schedule,
        SpecDecode,
        ProcessOutput,
        StartAsyncLoad,
        FinishAsyncLoad,
        Finish,
        Preempt,
        FailedLoad,
        EvictBlocks,
        ResetPrefixCache,
    )
}


OPTIONAL_FIELDS: dict[str, object] = {"same_step": False}
"""Operation fields a trace may leave out, with the value they then take (left out when they have it)."""


def op_to_json(op: Operation) -> dict[str, Any]:
    """The JSON object of an operation: ``{"op": name, **fields}``, optional fields at their default left
    out."""
    fields = {
        k: v for k, v in attrs.asdict(op, recurse=False).items() if k not in OPTIONAL_FIELDS or v != OPTIONAL_FIELDS[k]
    }
    return {"op": op.name, **{k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}}


def describe_op(op: Operation) -> str:
    """A short human-readable rendering, e.g. ``schedule(r1, new=4, ext=2)``."""
    if isinstance(op, Schedule):
        extra = f", ext={op.num_external_tokens}" if op.num_external_tokens else ""
        step = ", same step" if op.same_step else ""
        return f"schedule({op.request_id}, new={op.num_new_tokens}{extra}, sampled={op.sampled_token}{step})"
    if isinstance(op, SpecDecode):
        return (
            f"spec_decode({op.request_id}, drafts={op.num_draft_tokens}, accepted={op.num_accepted_tokens}, "
            f"sampled={op.sampled_token})"
        )
    if isinstance(op, AddRequest):
        return f"add_request({op.request_id}, prompt={list(op.prompt)})"
    if isinstance(op, EvictBlocks):
        return f"evict_blocks({list(op.block_ids)})"
    if isinstance(op, StartAsyncLoad):
        return f"start_async_load({op.request_id}, ext={op.num_external_tokens})"
    if isinstance(op, ResetPrefixCache | ProcessOutput):
        return f"{op.name}()"
    return f"{op.name}({op.request_id})"


StateOffload = tuple[str, int, int, int]
"""A boundary state offered a KV connector: (request id, group, block id, the tokens the state is after)."""


def flat_state_offloads(offloads: Mapping[str, Sequence[tuple[int, int, int]]]) -> tuple[StateOffload, ...]:
    """Offers as an allocator hands them over, per request as (group, block id, tokens), flattened."""
    return tuple(
        (rid, group_id, block_id, tokens) for rid, entries in offloads.items() for group_id, block_id, tokens in entries
    )


@attrs.frozen
class StepResult:
    """What an operation returned, as far as the invariants care.

    ``admitted`` is set for :class:`Schedule` (``False``: ``allocate_slots``
    returned ``None``); ``hit_length``/``hit_block_ids`` for the schedule of a
    waiting request; ``new_block_ids`` for an admitted schedule;
    ``reset_done`` for :class:`ResetPrefixCache`; ``num_slots`` for an
    admitted step: the token positions it asked slots for (computed, new,
    drafts and lookahead); ``block_copies`` the (source, destination) block
    copies the step handed the worker (a sub-block hit's copy on write);
    ``zeroed_block_ids`` the blocks it handed the worker to zero before it
    runs (when the cache needs zeroing), in the allocator's order;
    ``state_offloads`` the boundary states the allocator offered a KV
    connector with the operation (``take_boundary_state_offloads`` after
    it, a finishing request's ``finalize_partial_tail_offloads`` before its
    free), as (request id, group, block id, the tokens the state is after),
    request by request in the order they first appear, each request's group
    by group (see :func:`flat_state_offloads`).  On releases with the
    side-effect-free probe (``cached_tokens_probe``, kvcheck/vllm_releases.py),
    ``probed_tokens`` is what ``get_num_cached_tokens`` said of a waiting
    request just before its lookup, and ``probe_changed`` names the
    observed fields the probe changed (none, if it is side-effect free).
    """

    admitted: bool | None = None
    hit_length: int | None = None
    hit_block_ids: GroupIds | None = None
    new_block_ids: GroupIds | None = None
    num_external_tokens: int = 0
    reset_done: bool | None = None
    num_slots: int | None = None
    block_copies: tuple[tuple[int, int], ...] = ()
    zeroed_block_ids: tuple[int, ...] = ()
    state_offloads: tuple[StateOffload, ...] = ()
    probed_tokens: int | None = None
    probe_changed: tuple[str, ...] = ()


def first_reference_error(ops: Iterable[Operation], num_blocks: int) -> tuple[int, str, str] | None:
    """The first operation that refers to something that does not exist, as (step, field, message).

    A request must be added before it is used, is gone once finished, and is
    not added twice while live; evicted block ids must exist in the pool.
    """
    live: set[str] = set()
    for step, op in enumerate(ops):
        if isinstance(op, AddRequest):
            if op.request_id in live:
                return step, "request_id", f"request {op.request_id!r} is added twice"
            live.add(op.request_id)
        elif isinstance(op, REQUEST_OPERATIONS):
            if op.request_id not in live:
                return step, "request_id", f"unknown request {op.request_id!r} (not added, or already finished)"
            if isinstance(op, Finish):
                live.discard(op.request_id)
        elif isinstance(op, EvictBlocks):
            for index, block_id in enumerate(op.block_ids):
                if block_id >= num_blocks:
                    return step, f"block_ids[{index}]", f"block {block_id} does not exist in a pool of {num_blocks}"
    return None
