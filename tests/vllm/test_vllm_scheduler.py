"""vLLM's own ``Scheduler`` in the loop: workloads run through it offline on CPU, every call it makes
into its ``KVCacheManager`` read as an operation and checked against the model.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.faults import VLLM_FAULTS  # noqa: E402
from kvcheck.lockstep import Lockstep  # noqa: E402
from kvcheck.targets import load_target  # noqa: E402
from kvcheck.vllm_scheduler.build import SchedulerSettings, build_scheduler, scheduled_config  # noqa: E402
from kvcheck.vllm_scheduler.check import check_record  # noqa: E402
from kvcheck.vllm_scheduler.engine import SchedulerRun  # noqa: E402
from kvcheck.vllm_scheduler.search import run_case, search  # noqa: E402
from kvcheck.vllm_scheduler.workload import Abort, Arrival, Workload  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.invariants import InvariantViolation  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Preempt, Schedule  # noqa: E402

SETTINGS = SchedulerSettings(max_num_batched_tokens=16, max_num_seqs=4)


def config(num_blocks: int, *groups: GroupSpec, caching: bool = True, full_sequence: bool = False) -> TargetConfig:
    return scheduled_config(
        TargetConfig(
            num_blocks=num_blocks,
            block_size=2,
            groups=groups or (GroupSpec(kind="full"),),
            enable_caching=caching,
            reserve_full_sequence=full_sequence,
        ),
        SETTINGS,
    )


def test_a_tight_pool_makes_the_scheduler_preempt_and_the_model_agrees() -> None:
    """Two 8-token requests sampling 4 tokens each share a pool of 9 usable 2-token blocks: both are
    admitted, the later one is preempted when the earlier one's decode runs out of blocks, and comes
    back on what is left of its own cached blocks."""
    workload = Workload(
        (
            Arrival(0, "a", tuple(range(8)), (7, 7, 7, 7)),
            Arrival(0, "b", tuple(range(10, 18)), (7, 7, 7, 7)),
        )
    )
    record = SchedulerRun(config(10), SETTINGS).run(workload)
    check_record(record)
    ops = record.ops
    assert ops[:4] == (
        AddRequest("a", tuple(range(8))),
        AddRequest("b", tuple(range(10, 18))),
        Schedule("a", 8, sampled_token=7),
        Schedule("b", 8, sampled_token=7, same_step=True),
    )
    assert Preempt("b") in ops and ops.index(Preempt("b")) < ops.index(Finish("a"))
    rescheduled = [i for i, op in enumerate(ops) if op == Schedule("b", 1, sampled_token=7)]
    assert rescheduled and record.stalled_at is None
    # Back from preemption, b hits what is left of its own prompt's blocks, cached before they were
    # freed (a's decode took the last of them).
    results = [result for step in record.steps for result in step.results]
    preempted = ops.index(Preempt("b"))
    back = [
        results[i]
        for i, op in enumerate(ops)
        if i > preempted and isinstance(op, Schedule) and op.request_id == "b" and results[i].admitted
    ]
    assert back[0].hit_length == 6


def test_random_workloads_keep_every_invariant_and_reach_preemption() -> None:
    """Random configurations the scheduler runs, random budgets and workloads: every call keeps every
    invariant; the runs preempt, and some stall on a request that never fits (a state, not a hang)."""
    report = search(seed=0, max_runs=60)
    assert report.failure is None, str(report.failure and report.failure.violation)
    assert report.runs == 60 and report.preemptions > 0 and report.stalled > 0


def test_the_calls_replay_as_a_trace_on_kvcore_and_on_kvcheck_s_own_scheduler() -> None:
    """The scheduler's calls, read as operations, are a trace: kvcore and vLLM driven by kvcheck's own
    scheduler keep every invariant on it too."""
    workload = Workload(
        (
            Arrival(0, "a", (1, 2, 1, 2, 1), (1, 2)),
            Arrival(1, "b", (1, 2, 1, 2, 2, 2), (1,)),
            Arrival(2, "c", (3,), (3,)),
        ),
        (Abort(3, "c"),),
    )
    record = SchedulerRun(config(8, GroupSpec(kind="full"), GroupSpec(kind="sliding_window", window=2)), SETTINGS).run(
        workload
    )
    check_record(record)
    for target in ("kvcore", "vllm"):
        lockstep = Lockstep(load_target(target), record.config)
        for op in record.ops:
            lockstep.step(op)


def test_a_request_that_never_fits_stalls_the_run_and_the_pool_drains() -> None:
    """With the whole sequence reserved at admission, a 40-token request cannot fit 9 blocks of 2: it
    waits, the run stalls, and the abort at the end leaves every block free."""
    workload = Workload((Arrival(0, "a", tuple(range(40)), (1,)),))
    record = SchedulerRun(config(10, full_sequence=True), SETTINGS).run(workload)
    check_record(record)
    assert record.stalled_at == 0
    assert record.steps[-1].observation.num_free == 9 and not record.steps[-1].observation.tables


def test_a_fault_in_the_schedulers_manager_is_caught_and_shrunk() -> None:
    """FIFO reuse with caching off, planted into the scheduler's own manager: caught by the reuse order,
    shrunk to a request's arrival, its step and its finish in a pool of 2 blocks and one group; the
    shrunk case runs clean on vLLM."""
    report = search(seed=0, max_runs=50, plant=VLLM_FAULTS["fifo-reuse-when-caching-off"].plant)
    assert report.failure is not None and report.shrunk is not None
    assert report.shrunk.violation.invariant == "lifo_head_reuse_when_caching_off"
    assert len(report.shrunk.record.ops) <= len(report.failure.record.ops)
    assert [type(op) for op in report.shrunk.record.ops] == [AddRequest, Schedule, Finish]
    assert len(report.shrunk.case.config.groups) == 1 and report.shrunk.case.config.num_blocks == 3
    _, clean = run_case(report.shrunk.case)
    assert clean is None


def test_an_allocation_that_raises_is_reported_at_its_call() -> None:
    """Speculative blocks left out of a Mamba group's admission count make the allocation the scheduler
    admitted run dry inside ``allocate_slots``: reported as ``target_raised`` naming the call."""
    workload = Workload((Arrival(0, "a", (2, 0, 0, 1), (1,)),))
    case_config = scheduled_config(
        TargetConfig(
            num_blocks=10,
            block_size=3,
            groups=(GroupSpec(kind="full"), *(GroupSpec(kind="mamba", speculative_blocks=1),) * 3),
            enable_caching=False,
        ),
        SETTINGS,
    )
    record = SchedulerRun(case_config, SETTINGS, VLLM_FAULTS["mamba-speculative-blocks-not-counted"].plant).run(
        workload
    )
    with pytest.raises(InvariantViolation) as raised:
        check_record(record)
    assert raised.value.invariant == "target_raised" and "allocate_slots(a)" in raised.value.op
    check_record(SchedulerRun(case_config, SETTINGS).run(workload))


def test_a_configuration_the_scheduler_cannot_run_yet_is_refused_by_field() -> None:
    """Async scheduling is not driven yet: building its scheduler names the field."""
    with pytest.raises(ValueError, match=r"^async_scheduling: "):
        build_scheduler(
            scheduled_config(
                TargetConfig(
                    num_blocks=8,
                    block_size=2,
                    groups=(GroupSpec(kind="full"),),
                    enable_caching=True,
                    async_scheduling=True,
                ),
                SETTINGS,
            ),
            SETTINGS,
        )


def test_kvcheck_s_own_scheduler_makes_the_calls_vllm_s_makes() -> None:
    """Replayed through kvcheck's own scheduler, the operations of 40 random runs make the same calls,
    with the same arguments and results, as vLLM's scheduler made."""
    report = search(seed=2, max_runs=40, check_imitation=True)
    assert report.failure is None and report.imitation_gap is None and report.runs == 40


def test_an_imitation_that_passes_other_arguments_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """kvcheck's scheduler made to tell the allocator, wrongly, whether other requests are scheduled:
    the first admission already differs from vLLM's call."""
    from kvcheck.targets.vllm_target import VllmTarget
    from kvcheck.vllm_scheduler.imitation import imitation_gap

    keywords = VllmTarget.allocate_slots_keywords

    def slipped(self: VllmTarget, *args: object, **kwargs: object) -> dict[str, object]:
        chosen = keywords(self, *args, **kwargs)  # type: ignore[arg-type]
        if "has_scheduled_reqs" in chosen:
            chosen["has_scheduled_reqs"] = not chosen["has_scheduled_reqs"]
        return chosen

    record = SchedulerRun(config(10), SETTINGS).run(Workload((Arrival(0, "a", (1, 2, 3), (4,)),)))
    assert imitation_gap(record) is None
    monkeypatch.setattr(VllmTarget, "allocate_slots_keywords", slipped)
    gap = imitation_gap(record)
    assert gap is not None and gap.position == 2 and gap.op == Schedule("a", 3, sampled_token=4)
