"""The engine loop around vLLM's scheduler and its model runner.

Each engine step adds what arrives, aborts what the user aborts, asks the scheduler for a batch, has
the model runner sample one token for every request whose scheduled tokens reach its end (none for
a prefill chunk), and hands the output back, as vLLM's engine core does in ``step``.  The scheduler's
calls into its allocator are read as operations (:mod:`~kvcheck.vllm_scheduler.recorder`); once a
step's output is processed, the allocator's state is observed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import attrs

from kvcheck.targets.vllm_target import VllmTarget, make_request
from kvcheck.vllm_scheduler.build import SchedulerSettings, build_scheduler
from kvcheck.vllm_scheduler.recorder import Call, CallRecorder
from kvcheck.vllm_scheduler.workload import Workload
from kvmodel.config import TargetConfig
from kvmodel.observation import Observation
from kvmodel.ops import AddRequest, Operation, Schedule, StepResult

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
