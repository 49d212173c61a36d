"""The engine loop around vLLM's scheduler, its model runner, and the record of the scheduler's calls
into its allocator, read as kvcheck operations.

Each engine step adds what arrives, aborts what the user aborts, asks the scheduler for a batch, has
the model runner sample one token for every request whose scheduled tokens reach its end (none for
a prefill chunk), and hands the output back, as vLLM's engine core does in ``step``.  The calls the
scheduler makes into its ``KVCacheManager`` are recorded as they happen (the instance's methods are
wrapped; the class is never patched) and read as the operations the model understands: an
``allocate_slots`` is a :class:`~kvmodel.ops.Schedule` of that request, with what vLLM returned; a
``free`` while scheduling is a :class:`~kvmodel.ops.Preempt`, one after the output or an abort a
:class:`~kvmodel.ops.Finish`.  Once a step's output is processed, the allocator's state is observed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import attrs

from kvcheck.targets.allocator_hooks import block_ids
from kvcheck.targets.vllm_internals import group_managers
from kvcheck.targets.vllm_target import VllmTarget, make_request
from kvcheck.vllm_scheduler.build import SchedulerSettings, build_scheduler
from kvcheck.vllm_scheduler.workload import Workload
from kvmodel.config import TargetConfig
from kvmodel.observation import Observation
from kvmodel.ops import AddRequest, Finish, GroupIds, Operation, Preempt, Schedule, StepResult

MAX_IDLE_STEPS = 3
"""Steps in a row that schedule nothing, with nothing left to arrive, after which the run is stalled:
the waiting requests cannot be admitted (a legitimate state of a small pool, not a hang)."""


@attrs.frozen
class SchedulerStep:
    """One engine step: the operations the scheduler's allocator calls amount to, in order, with what
    vLLM returned for each, and the allocator's state once the step's output was processed."""

    number: int
    ops: tuple[Operation, ...]
    results: tuple[StepResult, ...]
    observation: Observation
    calls: tuple[tuple[Call, ...], ...] = ()
    """Per operation, the allocator calls it amounts to, with their arguments."""
    drained_for_zeroing: tuple[int, ...] | None = None
    """What the scheduler's drain of the zeroing record returned in this step (``None``: no drain)."""
    recorded_for_zeroing: tuple[int, ...] = ()
    """What the step's allocations recorded for zeroing before that drain, group by group."""


@attrs.frozen
class SchedulerRecord:
    """A workload's run through vLLM's scheduler: its steps, the last of which aborts whatever is left
    (or ends where an allocator call raised); ``stalled_at`` is the step from which nothing could be
    scheduled any more (``None``: every request ran to its end or was aborted)."""

    config: TargetConfig
    steps: tuple[SchedulerStep, ...]
    stalled_at: int | None
    raised: str | None = None
    """The allocator call that raised inside the scheduler, ending the run (``None``: none did)."""

    @property
    def ops(self) -> tuple[Operation, ...]:
        return tuple(op for step in self.steps for op in step.ops)


def _argument(value: object) -> object:
    """A call's argument as the record keeps it: a request by its id, blocks by their ids."""
    if hasattr(value, "request_id") and hasattr(value, "num_computed_tokens"):
        return value.request_id
    if hasattr(value, "blocks") and hasattr(value, "get_block_ids"):
        return block_ids(value.blocks)
    return value


Call = tuple[str, tuple[tuple[str, object], ...]]
"""An allocator call as the record keeps it: its name and its arguments by name."""


@attrs.frozen
class Taken:
    """What a :class:`CallRecorder` read since it was last asked: the operations, vLLM's result and
    the calls for each, what the scheduler's drain of the zeroing record returned (``None``: no drain),
    and what the allocations before it recorded, group by group."""

    ops: tuple[Operation, ...]
    results: tuple[StepResult, ...]
    calls: tuple[tuple[Call, ...], ...]
    drained: tuple[int, ...] | None
    recorded: tuple[int, ...]


class UntranslatedCall(Exception):
    """The scheduler made an allocator call that has no kvcheck operation yet."""


class CallRecorder:
    """The scheduler's calls into one vLLM ``KVCacheManager``, as operations with vLLM's results.

    Only the scheduler's own calls are read (a call the manager makes into itself is not).  The
    ``phase`` says what the engine is doing (``schedule``, ``output`` or ``abort``): a free while
    scheduling preempts, otherwise it finishes."""

    READ = ("new_step_starts", "get_computed_blocks", "allocate_slots", "free", "take_new_block_ids")
    OP_CALLS = ("get_computed_blocks", "allocate_slots", "free")
    """The calls an operation amounts to (the others start a step or drain a record)."""
    UNTRANSLATED = ("cache_blocks", "evict_blocks", "reset_prefix_cache", "pop_blocks_for_free")

    def __init__(self, manager: Any, num_groups: int) -> None:
        self.phase = "schedule"
        self._groups = group_managers(manager)
        self.recorded_for_zeroing: list[list[int]] = [[] for _ in self._groups]
        """Per group, the blocks the allocations since the last drain recorded for zeroing."""
        self.drained: tuple[int, ...] | None = None
        """What the scheduler's last drain of the zeroing record returned (``None``: no drain yet)."""
        self._drained_expected: tuple[int, ...] = ()
        self.op_calls: list[tuple[Call, ...]] = []
        """Per operation read, the calls it amounts to, with their arguments."""
        self._pending_calls: list[Call] = []
        self.raised: str | None = None
        """The call the scheduler made that raised, and what it raised (``None``: none raised)."""
        self._no_hit: tuple[GroupIds, int] = tuple(() for _ in range(num_groups)), 0
        self.ops: list[Operation] = []
        self.results: list[StepResult] = []
        self._hits: dict[str, tuple[GroupIds, int]] = {}
        self._joins_step = False
        self._depth = 0
        for name in (*self.READ, *self.UNTRANSLATED):
            self._wrap(manager, name)

    def take(self) -> Taken:
        """What was read since the last take."""
        taken = Taken(tuple(self.ops), tuple(self.results), tuple(self.op_calls), self.drained, self._drained_expected)
        self.ops.clear()
        self.results.clear()
        self.op_calls.clear()
        self.drained, self._drained_expected = None, ()
        return taken

    def _read_op(self, op: Operation, result: StepResult) -> None:
        """An operation read, with vLLM's result and the calls since the last one."""
        self.ops.append(op)
        self.results.append(result)
        self.op_calls.append(tuple(self._pending_calls))
        self._pending_calls.clear()

    def add(self, op: Operation) -> None:
        """An operation the engine performs itself (a request's arrival)."""
        self._read_op(op, StepResult())

    def _wrap(self, manager: Any, name: str) -> None:
        call = getattr(manager, name)
        # The class's signature names every argument, whatever a planted fault wrapped the instance's with.
        signature = inspect.signature(getattr(type(manager), name))
        read = getattr(self, f"_read_{name}", None)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return call(*args, **kwargs)
            if read is None:
                raise UntranslatedCall(f"{name} while the engine does {self.phase}: no kvcheck operation reads it yet")
            bound = signature.bind(manager, *args, **kwargs)
            bound.apply_defaults()
            before = read(None, bound.arguments, None)
            self._depth += 1
            try:
                result = call(*args, **kwargs)
            except Exception as exc:
                request = bound.arguments.get("request")
                who = f"({request.request_id})" if request is not None else "()"
                self.raised = f"{name}{who} raised {type(exc).__name__}: {exc}"
                raise
            finally:
                self._depth -= 1
            if name in self.OP_CALLS:
                arguments = tuple((key, _argument(value)) for key, value in bound.arguments.items() if key != "self")
                self._pending_calls.append((name, arguments))
            read(before, bound.arguments, result)
            return result

        setattr(manager, name, recorded)

    # Each reader is called twice: before the call (``before`` is None; it returns what it needs to
    # remember of the request, which the call changes) and after it, with that and the result.

    def _read_new_step_starts(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        self._joins_step = False

    def _read_get_computed_blocks(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        if result is not None:
            blocks, hit_length = result[0], result[1]
            self._hits[arguments["request"].request_id] = block_ids(blocks.blocks), hit_length

    def _read_allocate_slots(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        request = arguments["request"]
        if before is None:
            return request.status.name, request.num_computed_tokens, [len(m.new_block_ids) for m in self._groups]
        status, computed, recorded_before = before
        # The blocks this call recorded for zeroing, group by group, read without draining the record.
        zeroed = [m.new_block_ids[start:] for m, start in zip(self._groups, recorded_before, strict=True)]
        for group, ids in zip(self.recorded_for_zeroing, zeroed, strict=True):
            group.extend(ids)
        if arguments["delay_cache_blocks"]:
            raise UntranslatedCall("allocate_slots with delay_cache_blocks: no connector is driven yet")
        waiting = status != "RUNNING"
        rid = request.request_id
        hit_ids, hit_length = self._hits.pop(rid, self._no_hit) if waiting else self._no_hit
        external = arguments["num_external_computed_tokens"]
        new_tokens = arguments["num_new_tokens"]
        op = Schedule(rid, new_tokens, num_external_tokens=external if waiting else 0, same_step=self._joins_step)
        self._joins_step = True
        admitted = result is not None
        slots = computed + hit_length + external + new_tokens + arguments["num_lookahead_tokens"]
        self._read_op(
            op,
            StepResult(
                admitted=admitted,
                hit_length=hit_length if waiting else None,
                hit_block_ids=hit_ids if waiting else None,
                new_block_ids=block_ids(result.blocks) if admitted else None,
                num_external_tokens=external if admitted and waiting else 0,
                num_slots=slots if admitted else None,
                zeroed_block_ids=tuple(block for ids in zeroed for block in ids),
            ),
        )
        return None

    def _read_take_new_block_ids(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        if before is None:
            return True
        self.drained = tuple(result)
        self._drained_expected = tuple(block for ids in self.recorded_for_zeroing for block in ids)
        self.recorded_for_zeroing = [[] for _ in self._groups]
        return None

    def _read_free(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        if before is None:
            return True
        rid = arguments["request"].request_id
        self._hits.pop(rid, None)
        self._read_op(Preempt(rid) if self.phase == "schedule" else Finish(rid), StepResult())
        return None


class SchedulerRun:
    """One workload through vLLM's ``Scheduler``, built for ``config`` with ``settings``; ``plant``, a
    fault's vLLM plant (:mod:`kvcheck.faults`), is planted into the scheduler's own manager."""

    def __init__(
        self, config: TargetConfig, settings: SchedulerSettings, plant: Callable[[Any], None] | None = None
    ) -> None:
        self.config = config
        self.scheduler = build_scheduler(config, settings)
        manager = self.scheduler.kv_cache_manager
        if plant is not None:
            plant(manager)
        self.recorder = CallRecorder(manager, len(config.groups))
        self.observer = VllmTarget(config, manager=manager)
        self._outputs: dict[str, tuple[int, ...]] = {}

    def run(self, workload: Workload, max_steps: int = 200) -> SchedulerRecord:
        """Run ``workload`` until every request is done, the scheduler stalls, or ``max_steps`` engine
        steps; then abort what is left, in a last step."""
        from vllm.v1.request import RequestStatus

        steps: list[SchedulerStep] = []
        try:
            stalled_at = self._run(workload, max_steps, steps)
        except Exception:
            if self.recorder.raised is None:
                raise
            steps.append(self._step_record(len(steps)))
            return SchedulerRecord(self.config, tuple(steps), None, self.recorder.raised)
        self.recorder.phase = "abort"
        left = list(self.scheduler.requests)
        if left:
            self.scheduler.finish_requests(left, RequestStatus.FINISHED_ABORTED)
        steps.append(self._step_record(len(steps)))
        return SchedulerRecord(self.config, tuple(steps), stalled_at)

    def _run(self, workload: Workload, max_steps: int, steps: list[SchedulerStep]) -> int | None:
        """The engine steps, appended to ``steps``; the step the run stalled at, if it did."""
        from vllm.v1.request import RequestStatus

        idle = 0
        stalled_at = None
        for number in range(max_steps):
            self.recorder.phase = "abort"
            for abort in workload.aborts:
                if abort.step == number and abort.request_id in self.scheduler.requests:
                    self.scheduler.finish_requests(abort.request_id, RequestStatus.FINISHED_ABORTED)
            for arrival in workload.arrivals:
                if arrival.step == number:
                    self._arrive(arrival.request_id, arrival.prompt, arrival.outputs)
            if number > workload.last_step and not self.scheduler.has_requests():
                break
            scheduled = self._engine_step()
            steps.append(self._step_record(number))
            idle = 0 if scheduled or number < workload.last_step else idle + 1
            if idle >= MAX_IDLE_STEPS:
                stalled_at = number - MAX_IDLE_STEPS + 1
                break
        return stalled_at

    def _arrive(self, request_id: str, prompt: tuple[int, ...], outputs: tuple[int, ...]) -> None:
        request = make_request(
            request_id, prompt, self.config.hash_size, self.config.num_hash_lookahead_tokens, max_tokens=len(outputs)
        )
        self._outputs[request_id] = outputs
        self.scheduler.add_request(request)
        self.recorder.add(AddRequest(request_id, prompt))
        self.observer.follow(request_id, request)

    def _engine_step(self) -> bool:
        """Schedule a batch, sample, process the output; whether the batch scheduled any token."""
        self.recorder.phase = "schedule"
        output = self.scheduler.schedule()
        sampled = {
            rid: self._outputs[rid][len(self.scheduler.requests[rid].output_token_ids)]
            for rid in output.num_scheduled_tokens
            if not self.scheduler.requests[rid].is_prefill_chunk
        }
        self.recorder.phase = "output"
        self.scheduler.update_from_output(output, self._runner_output(list(output.num_scheduled_tokens), sampled))
        # The model appends a step's sampled token as the step's own: the token is known only now.
        self.recorder.ops[:] = [
            attrs.evolve(op, sampled_token=sampled[op.request_id])
            if isinstance(op, Schedule) and op.request_id in sampled
            else op
            for op in self.recorder.ops
        ]
        return bool(output.total_num_scheduled_tokens)

    def _runner_output(self, request_ids: list[str], sampled: dict[str, int]) -> Any:
        """The model runner's output: one sampled token per request that reached its end."""
        from vllm.v1.outputs import ModelRunnerOutput

        keywords: dict[str, Any] = {
            "req_ids": request_ids,
            "sampled_token_ids": [[sampled[rid]] if rid in sampled else [] for rid in request_ids],
        }
        if "req_id_to_index" in inspect.signature(ModelRunnerOutput).parameters:  # vLLM 0.33.0
            keywords["req_id_to_index"] = {rid: index for index, rid in enumerate(request_ids)}
        return ModelRunnerOutput(**keywords)

    def _step_record(self, number: int) -> SchedulerStep:
        """The step's operations and results, and the allocator's state now."""
        for rid in list(self.observer.requests):
            if rid in self.scheduler.requests:
                self.observer.learn_hashes(rid)
            else:
                self.observer.unfollow(rid)
        taken = self.recorder.take()
        return SchedulerStep(
            number, taken.ops, taken.results, self.observer.observe(), taken.calls, taken.drained, taken.recorded
        )
