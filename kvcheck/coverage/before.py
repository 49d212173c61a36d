"""What the coverage labels need of the model just before an operation, and the model's answers about the
state the operation plans from."""

from __future__ import annotations

import copy
from collections.abc import Callable

import attrs

from kvcheck.coverage.states import StateMarks, aligned_group_ids, junction_state_cached_since, states_thinned_since
from kvmodel.kinds import Kind
from kvmodel.manager_model import ManagerModel, skipped_tokens
from kvmodel.observation import CacheKey
from kvmodel.ops import Operation, ProcessOutput, Schedule, SpecDecode, StartAsyncLoad
from kvmodel.pool_model import NULL


def sliding(kind: Kind) -> bool:
    """A sliding-window kind."""
    return kind.sliding


def keeps_prompt(kind: Kind) -> bool:
    """A kind that keeps the prompt's blocks beside its window (R-SWA)."""
    return kind.keeps_prompt


def frees_behind_state(kind: Kind) -> bool:
    """A Mamba kind that keeps only its last state (vLLM's ``none`` cache mode)."""
    return kind.holds_state and not kind.aligned_states


@attrs.define
class BeforeStep:
    """What the labels need of the model just before a step."""

    free: set[int]
    cached: set[int]
    sliding_nulls: int
    rswa_nulls: int
    mamba_nulls: int
    ring_held: bool
    """For a step of a request: it holds its ring-buffer block(s) already."""
    held_by_request: set[int]
    plain_hit_tokens: int | None
    """For a waiting request's schedule with an EAGLE drafter: the hit without the drop."""
    window_held: bool
    """For a running request's schedule: a block past the processed tokens' window, but inside the
    scheduled tokens' one, is still in its table (a step in flight reads it)."""
    num_deferred: int
    num_events: int
    partial_entries: set[tuple[CacheKey, int]]
    found_hit_tokens: int
    """For a waiting request's schedule or asynchronous load that may load external tokens, or look up a
    hit on states sharded over decode context parallel ranks: the hit its lookup finds, before it is cut
    back (0 otherwise)."""
    planning: ManagerModel | None
    """For a schedule whose allocation may hold back a prefill checkpoint: the model as the step plans its
    allocation from (a copy, unchanged by the step)."""
    marks: StateMarks | None
    """With align-mode Mamba groups and prefix caching: the states the step's caching is compared with."""
    thinned_first: bool
    """A schedule's processing of the oldest step's output left a state uncached by a retention interval."""
    junction_first: bool
    """A schedule's processing of the oldest step's output entered a shared-prefix checkpoint."""

    @classmethod
    def capture(cls, model: ManagerModel, op: Operation) -> BeforeStep:
        request_id = getattr(op, "request_id", None)
        holders = model.pool.holders.items()
        held = {b for holder, table in holders if isinstance(holder, tuple) and holder[0] == request_id for b in table}
        plain = None
        if isinstance(op, Schedule) and model.config.use_eagle and model.config.enable_caching:
            request = model.requests.get(op.request_id)
            if request is not None and not request.running:
                plain = model.plain_hit_tokens(op.request_id)
        start = _planned_from(model, op)
        marks = StateMarks.of(model) if aligned_group_ids(model) and model.config.enable_caching else None
        thinned_first = junction_first = False
        if marks is not None and start is not model:
            thinned_first = states_thinned_since(marks, start)
            junction_first = junction_state_cached_since(marks, start)
            marks = StateMarks.of(start)
        return cls(
            set(model.pool.free_order),
            set(model.pool.cache),
            null_count(model, op, sliding),
            null_count(model, op, keeps_prompt),
            null_count(model, op, frees_behind_state),
            any(
                model.pool.holders.get((request_id, g))
                for g, group in enumerate(model.groups)
                if group.rules.scratch_block
            ),
            held - {NULL},
            plain,
            _window_held(model, op),
            len(model.pipeline.deferred),
            len(model.events or ()),
            partial_entries(model),
            _found_hit_tokens(model, start, op),
            _planning_model(model, start, op),
            marks,
            thinned_first,
            junction_first,
        )


def _planned_from(model: ManagerModel, op: Operation) -> ManagerModel:
    """The model as the operation plans from it: for a schedule that first processes the oldest step's
    output (the steps in flight fill the pipeline), a copy with that output processed; else the model."""
    request = model.requests.get(getattr(op, "request_id", ""))
    if not isinstance(op, Schedule) or request is None or request.loading or not model.pipeline.full():
        return model
    start = copy.deepcopy(model)
    start.apply(ProcessOutput())
    return start


def _found_hit_tokens(model: ManagerModel, start: ManagerModel, op: Operation) -> int:
    """The hit a waiting request's schedule or asynchronous load finds before it is cut back, where a label
    reads it: the operation asks for external tokens, or a schedule beside align-mode Mamba groups may hit
    a state inside a block sharded over decode context parallel ranks (0 otherwise)."""
    if not isinstance(op, Schedule | StartAsyncLoad) or not model.config.enable_caching:
        return 0
    request = model.requests.get(op.request_id)
    if request is None or request.running or request.loading:
        return 0
    sharded_states = isinstance(op, Schedule) and model.aligned_mamba and model.config.dcp_world_size > 1
    if not op.num_external_tokens and not sharded_states:
        return 0
    return start.find_hit(op.request_id)[0]


def _planning_model(model: ManagerModel, start: ManagerModel, op: Operation) -> ManagerModel | None:
    """For a schedule beside align-mode Mamba groups with prefill checkpoints and a retention interval of 0
    (which holds back every checkpoint but the prefill's last chunk's), a copy of the model the step plans
    from; ``None`` otherwise."""
    request = model.requests.get(getattr(op, "request_id", ""))
    if not isinstance(op, Schedule) or request is None or request.loading or model.retention != 0:
        return None
    if not any(model.groups[g].prefill_checkpoint_alignment is not None for g in aligned_group_ids(model)):
        return None
    return start if start is not model else copy.deepcopy(model)


def _window_held(model: ManagerModel, op: Operation) -> bool:
    """Whether a schedule of a running request keeps a window block only because of steps in flight."""
    request = model.requests.get(getattr(op, "request_id", ""))
    if not isinstance(op, Schedule) or request is None or not request.running or not request.num_in_flight_tokens:
        return False
    in_flight = request.num_in_flight_tokens
    oldest = model.pipeline.steps[0] if model.pipeline.full() else None
    if oldest is not None and oldest.request is request:
        in_flight -= oldest.num_scheduled_tokens  # processed before the step is scheduled
    computed = request.num_computed_tokens
    for group_id, group in enumerate(model.groups):
        table = model.pool.holders.get((op.request_id, group_id), [])
        block_size = model.block_sizes[group_id]
        processed_end = skipped_tokens(group, max(0, computed - in_flight)) // block_size
        scheduled_end = min(skipped_tokens(group, computed) // block_size, len(table))
        if any(b != NULL for b in table[processed_end:scheduled_end]):
            return True
    return False


def partial_entries(model: ManagerModel) -> set[tuple[CacheKey, int]]:
    """The cache entries under a partial key: a hash boundary inside its block (none, without looking,
    where no full-attention group's blocks are larger than the hashes)."""
    if not any(
        group.rules.full_hit and size != model.hash_size for group, size in zip(model.groups, model.block_sizes)
    ):
        return set()
    lookahead = model.config.num_hash_lookahead_tokens
    return {
        ((group_id, prefix), block_id)
        for (group_id, prefix), block_id in model.pool.entries()
        if (len(prefix) - lookahead) % model.block_sizes[group_id]
    }


def null_count(model: ManagerModel, op: Operation, trait: Callable[[Kind], bool]) -> int:
    """Null blocks in the tables of a scheduled request's groups whose kind has ``trait``."""
    if not isinstance(op, Schedule | SpecDecode):
        return 0
    return sum(
        model.pool.holders.get((op.request_id, g), []).count(NULL)
        for g, group in enumerate(model.groups)
        if trait(group.rules)
    )
