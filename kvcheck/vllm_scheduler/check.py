"""A run of vLLM's scheduler checked against the reference model.

The model takes the operations the scheduler's calls amount to, one by one.  After each, what vLLM
returned (the admission, the hit, the new blocks, the slots) must be what the model returns; at the end
of each engine step, once its output is processed, the allocator's whole state must be the model's and
keep every invariant, and the blocks the scheduler drains from the zeroing record for the worker must
be those the step's allocations recorded; after the last step, which aborts whatever is left, every block but the null
block is free and no request holds a table.  Within a step only the returned values are compared: the
model appends a step's sampled token as it schedules it, the engine once the batch's output is back.
"""

from __future__ import annotations

import attrs

from kvcheck.vllm_releases import semantics_in_force
from kvcheck.vllm_scheduler.engine import SchedulerRecord
from kvmodel.invariants import EventReplay, InvariantViolation, StepCheck, check_all, check_results
from kvmodel.manager_model import ManagerModel
from kvmodel.ops import describe_op


def check_record(record: SchedulerRecord) -> None:
    """Raise the first :class:`~kvmodel.invariants.InvariantViolation`; its step is the operation's
    position among all the record's operations, counted from 1, as a trace of them numbers it."""
    config = record.config
    model = ManagerModel(config, semantics_in_force())
    events = EventReplay() if config.enable_kv_cache_events else None
    position = 0
    last: StepCheck | None = None
    for index, step in enumerate(record.steps):
        broken = record.raised is not None and index == len(record.steps) - 1
        checked = None
        for op, vllm_result in zip(step.ops, step.results, strict=True):
            position += 1
            model_result = model.apply(op)
            if vllm_result.probed_tokens is None:
                # The scheduler admits without asking how much a request would hit (cache-aware
                # admission is off): the model's answer to a question not asked is not compared.
                model_result = attrs.evolve(model_result, probed_tokens=None)
            check_results(position, op, config, vllm_result, model_result)
            checked = op, vllm_result, model_result
        if step.drained_for_zeroing is not None and step.drained_for_zeroing != step.recorded_for_zeroing:
            raise InvariantViolation(
                "zeroed_blocks_are_fresh",
                position,
                describe_op(step.ops[-1]) if step.ops else "schedule()",
                "the scheduler's drain of the zeroing record differs from what the step's allocations recorded",
                step.recorded_for_zeroing,
                step.drained_for_zeroing,
            )
        if checked is None or broken:
            continue  # a step a raising call broke off leaves no state to compare
        op, vllm_result, model_result = checked
        last = StepCheck(position, op, config, vllm_result, model_result, step.observation, model.observe(), events)
        check_all(last)
    if record.raised is not None:
        raise InvariantViolation(
            "target_raised", position + 1, record.raised.split(" raised ")[0], f"vLLM's {record.raised}"
        )
    if last is not None:
        pool_drains_at_the_end(last)


def pool_drains_at_the_end(check: StepCheck) -> None:
    """Once every request is done or aborted, no table is left and every block but the null one is
    free.  Guards: a finished, aborted or preempted request whose blocks never return to the pool."""
    sut = check.sut
    free = check.config.num_blocks - 1
    if sut.tables or sut.num_free != free:
        raise InvariantViolation(
            "pool_drains_at_the_end",
            check.step,
            describe_op(check.op),
            "with every request done, blocks are still held",
            {"tables": {}, "num_free": free},
            {"tables": dict(sut.tables), "num_free": sut.num_free},
        )
