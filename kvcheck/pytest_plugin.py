"""kvcheck's pytest plugin: the suite's command-line options, the target fixture and the repro hook.

Installed with kvcheck (entry point ``pytest11``: ``kvcheck``), so the
suite runs from any folder against any allocator::

    pytest -p kvcheck --pyargs kvcheck.stateful_tests kvcheck.regressions --kvcheck-target mypkg.module:factory

The plugin is loaded into every pytest run of a venv that has kvcheck
installed, so it stays out of the way: its options are prefixed
(``--kvcheck-target``, ``--kvcheck-fault``, ``--kvcheck-groups``,
``--kvcheck-repros``; the checkout's ``conftest.py`` adds the short
spellings), it loads no Hypothesis profile (it registers the kvcheck profile
``--hypothesis-profile`` names, if no profile of that name is registered
yet) and parametrizes nothing outside kvcheck's own suite (that is the
suite's ``conftest.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.lockstep import Lockstep
from kvcheck.replay import resolve_target
from kvcheck.repro import failing_trace, write_repro
from kvcheck.targets import TargetFactory
from kvmodel.invariants import InvariantViolation

OPTIONS: dict[str, dict[str, object]] = {
    "target": {
        "default": "kvcore",
        "metavar": "TARGET",
        "help": (
            "allocator to drive: 'kvcore' (default), 'vllm', 'package.module:factory', "
            "or several of those joined by '+' (e.g. 'kvcore+vllm'), compared step by step"
        ),
    },
    "fault": {
        "default": None,
        "metavar": "FAULT",
        "help": (
            "plant a catalogued fault (see `kvcheck faults`) into the target: any fault into kvcore, "
            "those expressed against vllm into vllm too; the suite should then fail"
        ),
    },
    "groups": {
        "type": int,
        "default": None,
        "metavar": "N",
        "help": "fix the number of KV-cache groups (default: one run drawing 1 to 4 per example, then 2, 3 and 4)",
    },
    "repros": {
        "default": "repros",
        "metavar": "DIR",
        "help": "folder a failing run's shrunk trace and standalone test are written to (default: repros)",
    },
}
"""The suite's options by short name; the plugin registers them as ``--kvcheck-NAME`` (read them with
``config.getoption("kvcheck_NAME")``)."""


def add_options(parser: pytest.Parser, prefix: str) -> None:
    """Register the suite's options as ``--{prefix}NAME``, all stored under ``kvcheck_NAME``."""
    group = parser.getgroup("kvcheck")
    for name, settings in OPTIONS.items():
        group.addoption(f"--{prefix}{name}", dest=f"kvcheck_{name}", **settings)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser, "kvcheck-")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the kvcheck profile ``--hypothesis-profile`` names before Hypothesis's plugin loads it:
    installed, the suite's ``conftest.py`` (which registers them all) is read only at collection.  A
    profile of that name registered already (Hypothesis's own ``ci``, a repository's) is left alone,
    and none is loaded here."""
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    from kvcheck.profiles import PROFILES

    chosen = config.getoption("hypothesis_profile", default=None)
    if chosen not in PROFILES:
        return
    try:
        settings.get_profile(chosen)
    except InvalidArgument:
        settings.register_profile(chosen, PROFILES[chosen])


@pytest.fixture
def make_target(request: pytest.FixtureRequest) -> TargetFactory:
    """The factory of the target under test, from --target (and --fault: planted into kvcore, or
    into vLLM for the faults expressed against it)."""
    try:
        return resolve_target(request.config.getoption("kvcheck_target"), request.config.getoption("kvcheck_fault"))
    except ValueError as exc:
        raise pytest.UsageError(f"--kvcheck-target/--kvcheck-fault: {exc}") from None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """When a machine fails an invariant, write the shrunk trace and a standalone test beside it."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or call.excinfo is None:
        return
    violation: BaseException | None = call.excinfo.value
    while violation is not None and not isinstance(violation, InvariantViolation):
        violation = violation.__cause__ or violation.__context__
    lockstep = Lockstep.latest
    if violation is None or lockstep is None or len(lockstep.trace) < violation.step:
        return
    fault = item.config.getoption("kvcheck_fault")
    trace = failing_trace(lockstep.config, lockstep.trace, violation, fault, f"{item.nodeid}")
    stem = f"{item.name.removeprefix('test_')}-{violation.invariant}"
    folder = Path(item.config.getoption("kvcheck_repros"))
    json_path, py_path = write_repro(trace, folder, stem, item.config.getoption("kvcheck_target"))
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
