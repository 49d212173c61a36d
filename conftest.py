"""The command-line options every test run shares, and the repro hook.

Hypothesis profiles (``dev``, ``ci``, ``thorough``) are defined in
:mod:`stateful_tests.profiles`; choose one with ``--hypothesis-profile NAME``
or ``HYPOTHESIS_PROFILE=NAME`` (``ci`` is the default when CI is set).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.lockstep import Lockstep
from kvcheck.replay import resolve_target
from kvcheck.repro import failing_trace, write_repro
from kvcheck.targets import TargetFactory, component_allocators
from models.invariants import InvariantViolation
from stateful_tests.profiles import register_profiles

register_profiles()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcheck")
    group.addoption(
        "--target",
        default="kvcore",
        help=(
            "allocator to drive: 'kvcore' (default), 'vllm', 'package.module:factory', "
            "or several of those joined by '+' (e.g. 'kvcore+vllm'), compared step by step"
        ),
    )
    group.addoption(
        "--fault",
        default=None,
        help=(
            "plant a catalogued fault (see `kvcheck faults`) into the target: any fault into kvcore, "
            "those expressed against vllm into vllm too; the suite should then fail"
        ),
    )
    group.addoption(
        "--groups",
        type=int,
        default=None,
        help="fix the number of KV-cache groups (default: one run drawing 1 to 4 per example, then 2, 3 and 4)",
    )


@pytest.fixture
def make_target(request: pytest.FixtureRequest) -> TargetFactory:
    """The factory of the target under test, from --target (and --fault: planted into kvcore, or
    into vLLM for the faults expressed against it)."""
    try:
        return resolve_target(request.config.getoption("--target"), request.config.getoption("--fault"))
    except ValueError as exc:
        raise pytest.UsageError(f"--target/--fault: {exc}") from None


GROUP_LAYOUTS: tuple[int | None, ...] = (None, 2, 3, 4)
"""Group counts the manager machine runs with when --groups is not given: drawn from 1 to 4
per run, then 2, 3 and 4 fixed, so every hybrid width gets its own full example budget."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "allocator" in metafunc.fixturenames:
        _parametrize_allocators(metafunc)
    if "num_groups" not in metafunc.fixturenames:
        return
    groups: int | None = metafunc.config.getoption("--groups")
    if groups is not None and not 1 <= groups <= 8:
        raise pytest.UsageError(f"--groups={groups}: must be between 1 and 8")
    layouts = GROUP_LAYOUTS if groups is None else (groups,)
    ids = ["groups-1-to-4" if n is None else f"groups-{n}" for n in layouts]
    metafunc.parametrize("num_groups", layouts, ids=ids)


def _parametrize_allocators(metafunc: pytest.Metafunc) -> None:
    """The free-queue and block-pool machines run on each built-in allocator that --target names."""
    spec = metafunc.config.getoption("--target")
    allocators = component_allocators(spec)
    if allocators:
        metafunc.parametrize("allocator", allocators)
        return
    reason = f"--target {spec} names no built-in allocator; its free queue and block pool have no target"
    metafunc.parametrize("allocator", [pytest.param(spec, marks=pytest.mark.skip(reason=reason))])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """When a machine fails an invariant, write the shrunk trace and a standalone test beside it."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or call.excinfo is None:
        return
    violation = call.excinfo.value
    while violation is not None and not isinstance(violation, InvariantViolation):
        violation = violation.__cause__ or violation.__context__
    lockstep = Lockstep.latest
    if violation is None or lockstep is None or len(lockstep.trace) < violation.step:
        return
    fault = item.config.getoption("--fault")
    trace = failing_trace(lockstep.config, lockstep.trace, violation, fault, f"{item.nodeid}")
    stem = f"{item.name.removeprefix('test_')}-{violation.invariant}"
    json_path, py_path = write_repro(trace, Path("repros"), stem, item.config.getoption("--target"))
    flag = f" --fault {fault}" if fault else ""
    report.sections.append(
        (
            "kvcheck repro",
            f"shrunk trace ({len(trace.ops)} steps): {json_path}\n"
            f"standalone test: {py_path}\n"
            f"replay: kvcheck replay {json_path}{flag}\n"
            f"show:   kvcheck show {json_path}{flag}\n",
        )
    )
