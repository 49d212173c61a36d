"""Steps in flight under async scheduling, step by step: outputs, stale outputs, deferred frees.

Each case drives kvcore and the model in lockstep (every invariant checked)
and asserts the concrete state vLLM 0.33.0's scheduler would leave.
"""

from __future__ import annotations

from kvcheck.lockstep import Lockstep
from kvcheck.targets import load_target
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.ops import AddRequest, Finish, Preempt, ProcessOutput, Schedule, StartAsyncLoad, StepResult

ASYNC = TargetConfig(
    num_blocks=8, block_size=1, groups=(GroupSpec(kind="full"),), enable_caching=True, async_scheduling=True
)


def lockstep(config: TargetConfig = ASYNC) -> Lockstep:
    return Lockstep(load_target("kvcore"), config)


def test_a_step_samples_only_when_its_output_is_processed() -> None:
    """The prefill of [0, 1] goes in flight with a placeholder; the next step computes that placeholder
    ahead; each output then appends its sampled token in order, and caches the processed blocks."""
    run = lockstep()
    run.step(AddRequest("r0", (0, 1)))
    run.step(Schedule("r0", 2, 0, sampled_token=5))
    request = run.model.requests["r0"]
    assert request.tokens == [0, 1] and request.num_in_flight_tokens == 2
    assert run.model.pipeline.num_placeholders("r0") == 1
    run.step(Schedule("r0", 1, 0, sampled_token=6))  # the placeholder, scheduled ahead
    assert request.num_computed_tokens == 3 and request.num_in_flight_tokens == 3
    assert run.model.pipeline.num_placeholders("r0") == 2
    run.step(ProcessOutput())
    assert request.tokens == [0, 1, 5] and request.num_in_flight_tokens == 1
    assert {prefix for _, prefix in run.model.pool.cache.values()} == {(0,), (0, 1)}
    run.step(ProcessOutput())
    assert request.tokens == [0, 1, 5, 6] and request.num_in_flight_tokens == 0
    assert {prefix for _, prefix in run.model.pool.cache.values()} == {(0,), (0, 1), (0, 1, 5)}


def test_a_third_step_waits_for_the_oldest_output() -> None:
    """Two steps are in flight at most: scheduling a third processes the oldest output first."""
    run = lockstep()
    run.step(AddRequest("r0", (0, 1, 2, 3)))
    run.step(Schedule("r0", 1))
    run.step(Schedule("r0", 1))
    assert len(run.model.pipeline.steps) == 2
    run.step(Schedule("r0", 1))
    assert [step.num_scheduled_tokens for step in run.model.pipeline.steps] == [1, 1]
    assert run.model.pipeline.processed_seq == 1
    assert run.model.requests["r0"].num_computed_tokens == 3


def test_output_of_a_preempted_request_is_appended_but_stale() -> None:
    """Preempted with its step in flight, the request recomputes from 0; the step's token still
    arrives, but rolls nothing back and caches nothing."""
    run = lockstep()
    run.step(AddRequest("r0", (0, 1)))
    run.step(Schedule("r0", 2, 0, sampled_token=7))
    run.step(Preempt("r0"))
    request = run.model.requests["r0"]
    assert request.num_computed_tokens == 0 and run.model.pipeline.stale["r0"] == 2
    cached_before = dict(run.model.pool.cache)
    run.step(ProcessOutput())
    assert request.tokens == [0, 1, 7] and request.num_in_flight_tokens == 0
    assert run.model.pipeline.stale["r0"] == 0
    assert run.model.pool.cache == cached_before


def test_a_preempted_request_waits_until_its_stale_output_is_processed() -> None:
    """vLLM's scheduler skips a preempted request in its waiting queue while output it scheduled before
    the preemption is still in flight: a schedule or an asynchronous load of it does nothing (nothing
    looked up, nothing allocated), on the target as in the model, until that output is processed."""
    run = lockstep()
    run.step(AddRequest("r0", (0, 1, 2)))
    run.step(Schedule("r0", 2))
    run.step(Preempt("r0"))
    for op in (Schedule("r0", 3), StartAsyncLoad("r0", 2)):
        sut, model = run.step(op)
        assert sut == model == StepResult()
        assert not run.model.requests["r0"].running and run.model.requests["r0"].num_computed_tokens == 0
    run.step(ProcessOutput())
    assert not run.model.pipeline.holds_stale_output("r0")
    sut, model = run.step(Schedule("r0", 3))
    assert sut.admitted and model.admitted and run.model.requests["r0"].num_computed_tokens == 3


def test_a_deferred_free_holds_the_blocks_until_the_fenced_step_is_processed() -> None:
    """With deferred frees, finishing a request whose step is in flight pops its blocks; they return
    to the pool, tail first, only when that step's output is processed."""
    run = lockstep(
        TargetConfig(
            num_blocks=8,
            block_size=1,
            groups=(GroupSpec(kind="full"),),
            enable_caching=True,
            async_scheduling=True,
            defer_block_free=True,
        )
    )
    run.step(AddRequest("r0", (0, 1, 2)))
    run.step(Schedule("r0", 3))
    free_before = list(run.model.pool.free_order)
    run.step(Finish("r0"))
    assert run.target.observe().deferred_frees == ((1, 2, 3),)
    assert run.target.observe().free_order == tuple(free_before)
    run.step(ProcessOutput())
    observed = run.target.observe()
    assert observed.deferred_frees == ()
    assert observed.free_order[-3:] == (3, 2, 1)


def test_without_deferral_a_finished_request_frees_at_once() -> None:
    run = lockstep()
    run.step(AddRequest("r0", (0, 1, 2)))
    run.step(Schedule("r0", 3))
    run.step(Finish("r0"))
    observed = run.target.observe()
    assert observed.deferred_frees == () and observed.free_order[-3:] == (3, 2, 1)
    assert observed.in_flight_reads == ()  # the step's request was freed: nothing it reads must stay held
