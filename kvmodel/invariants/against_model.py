"""The invariants that compare the target with the model: admission, tables, cache, events, and the results a step
returns."""

from __future__ import annotations

from kvmodel.invariants.check import StepCheck, fail


def admission_matches_model(check: StepCheck) -> None:
    """allocate_slots refuses (returns None) exactly when the model says the step does not fit.

    Guards: spurious refusals that stall a request; over-admission that runs
    out of blocks half-way (hit blocks sitting free not counted as consumed)."""
    if check.sut_result.admitted != check.model_result.admitted:
        fail(
            check, "admission_matches_model", "admitted differs", check.model_result.admitted, check.sut_result.admitted
        )


def same_result(check: StepCheck, field: str, invariant: str, detail: str) -> None:
    """The target's ``field`` of the step's result is the model's, or ``invariant`` fails with ``detail``."""
    expected, actual = getattr(check.model_result, field), getattr(check.sut_result, field)
    if actual != expected:
        fail(check, invariant, detail, expected, actual)


def same_block_copies(check: StepCheck) -> None:
    same_result(check, "block_copies", "tables_match_model", "the block copies the step queued differ")


def tables_match_model(check: StepCheck) -> None:
    """Every request's table in every group is the one the model predicts (null blocks included), and
    so are the block copies a step queues (source and destination).

    Guards: a sliding-window or chunked-local skip off by one block; blocks
    not freed at preemption; a copy on write from or into the wrong block."""
    same_block_copies(check)
    if check.sut.deferred_frees != check.model.deferred_frees:
        fail(
            check,
            "tables_match_model",
            "the blocks held by deferred frees differ",
            check.model.deferred_frees,
            check.sut.deferred_frees,
        )
    if check.sut.tables != check.model.tables:
        differing = sorted(set(check.sut.tables) ^ set(check.model.tables)) or sorted(
            r for r in check.sut.tables if check.sut.tables[r] != check.model.tables.get(r)
        )
        first = differing[0]
        fail(
            check,
            "tables_match_model",
            f"table of request {first} differs",
            check.model.tables.get(first),
            check.sut.tables.get(first),
        )


def cache_matches_model(check: StepCheck) -> None:
    """The prefix cache holds exactly the entries the model predicts.

    Guards: a block cached too early (lookahead or unfinished tokens) or
    never; eviction that misses an entry."""
    if check.sut.cache_entries != check.model.cache_entries:
        extra = sorted(check.sut.cache_entries - check.model.cache_entries, key=repr)[:3]
        missing = sorted(check.model.cache_entries - check.sut.cache_entries, key=repr)[:3]
        fail(check, "cache_matches_model", f"unexpected entries {extra}; missing entries {missing}")


def events_match_model(check: StepCheck) -> None:
    """The KV cache event stream is exactly the one the model predicts: each store with its
    entries, parent and tokens, each removal, each clear, in order.

    Guards: events that replay to the right cache but say the wrong thing on
    the way (a removal reported late, a store split or merged differently)."""
    if not check.config.enable_kv_cache_events or check.sut.events == check.model.events:
        return
    sut, model = check.sut.events, check.model.events
    first = next((i for i, (a, b) in enumerate(zip(sut, model)) if a != b), min(len(sut), len(model)))
    fail(
        check,
        "events_match_model",
        f"KV cache event {first} differs (the stream has {len(sut)} events, the model {len(model)})",
        model[first] if first < len(model) else None,
        sut[first] if first < len(sut) else None,
    )


def same_state_offloads(check: StepCheck) -> None:
    detail = "the boundary states offered a connector differ from the model's"
    same_result(check, "state_offloads", "state_offloads_well_formed", detail)


def same_zeroed_blocks(check: StepCheck) -> None:
    detail = "the blocks the step hands the worker to zero differ from the model's"
    same_result(check, "zeroed_block_ids", "zeroed_blocks_are_fresh", detail)
