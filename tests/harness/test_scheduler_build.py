"""What of a configuration vLLM's own scheduler is asked to run, and the workloads' own checks; none of
it needs vLLM."""

from __future__ import annotations

import random

import attrs
import pytest

from kvcheck.vllm_scheduler.build import (
    DRIVEN_FIELDS,
    NOT_DRIVEN_YET,
    SchedulerSettings,
    refusal,
    scheduled_config,
)
from kvcheck.vllm_scheduler.search import random_case, smaller_workloads
from kvcheck.vllm_scheduler.workload import Abort, Arrival, Workload
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec

SETTINGS = SchedulerSettings(max_num_batched_tokens=8)


def test_every_configuration_field_is_driven_or_refused_with_a_reason() -> None:
    """A field added to the configuration must be given to the scheduler or refused away from its
    default: the two lists cover every field, once."""
    fields = {field.name for field in attrs.fields(TargetConfig)}
    assert DRIVEN_FIELDS | set(NOT_DRIVEN_YET) == fields
    assert not DRIVEN_FIELDS & set(NOT_DRIVEN_YET)


def test_a_refused_field_is_named_with_its_reason() -> None:
    base = scheduled_config(
        TargetConfig(num_blocks=8, block_size=2, groups=(GroupSpec(kind="full"),), enable_caching=True), SETTINGS
    )
    assert refusal(base, SETTINGS) is None
    assert refusal(attrs.evolve(base, async_scheduling=True), SETTINGS) == (
        "async_scheduling",
        NOT_DRIVEN_YET["async_scheduling"],
    )
    field, reason = refusal(attrs.evolve(base, max_in_flight_tokens=4), SETTINGS) or ("", "")
    assert field == "max_in_flight_tokens" and "8" in reason
    aligned = attrs.evolve(base, groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")))
    assert (refusal(aligned, SETTINGS) or ("",))[0] == "groups[1].kind"


def test_settings_vllm_refuses_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens: 2 is below max_num_seqs"):
        SchedulerSettings(max_num_batched_tokens=2, max_num_seqs=4)
    with pytest.raises(ValueError, match="policy"):
        SchedulerSettings(policy="lifo")


def test_a_malformed_workload_is_refused_naming_the_request() -> None:
    with pytest.raises(ValueError, match="'a': the prompt is empty"):
        Arrival(0, "a", (), (1,))
    with pytest.raises(ValueError, match="'a': no output token"):
        Arrival(0, "a", (1,), ())
    with pytest.raises(ValueError, match=r"requests arrive twice: \['a'\]"):
        Workload((Arrival(0, "a", (1,), (1,)), Arrival(1, "a", (2,), (1,))))
    with pytest.raises(ValueError, match=r"never arrive: \['b'\]"):
        Workload((Arrival(0, "a", (1,), (1,)),), (Abort(1, "b"),))


def test_random_cases_are_runnable_and_repeat_from_their_seed() -> None:
    """Every drawn case is one the scheduler runs, and the same seed draws the same cases."""
    first = [random_case(random.Random(seed)) for seed in range(40)]
    assert all(refusal(case.config, case.settings) is None for case in first)
    assert first == [random_case(random.Random(seed)) for seed in range(40)]


def test_each_smaller_workload_is_smaller() -> None:
    """The shrinker's candidates each drop a request or an abort, cut a prompt or an output, or move an
    arrival earlier."""
    workload = Workload((Arrival(2, "a", (1, 2, 3, 4), (1, 2)), Arrival(0, "b", (5,), (6,))), (Abort(3, "a"),))

    def size(w: Workload) -> tuple[int, int, int]:
        return (
            len(w.arrivals) + len(w.aborts),
            sum(len(a.prompt) + len(a.outputs) for a in w.arrivals),
            sum(a.step for a in w.arrivals),
        )

    candidates = list(smaller_workloads(workload))
    assert candidates and all(size(c) < size(workload) for c in candidates)
