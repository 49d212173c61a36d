"""The checkout's tests: kvcheck's pytest plugin (installed with the package) supplies the options
(``--kvcheck-target`` ...), the target fixture and the repro hook; this file adds the options' short
spellings (``--target``, ``--fault``, ``--groups``, ``--repros``) and loads the Hypothesis profile for
every test here.

Hypothesis profiles (``dev``, ``ci``, ``thorough``) are defined in
:mod:`kvcheck.profiles`; choose one with ``--hypothesis-profile NAME``
or ``HYPOTHESIS_PROFILE=NAME`` (``ci`` is the default when CI is set).
"""

from __future__ import annotations

import pytest

from kvcheck.profiles import register_profiles
from kvcheck.pytest_plugin import add_options


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser, "")


def pytest_configure(config: pytest.Config) -> None:
    register_profiles(config.getoption("hypothesis_profile", default=None))
    # Under xdist, hand each worker one test at a time (beyond the one it runs): the long tests,
    # collected first, then go to whichever worker is free instead of queueing behind one another.
    if getattr(config.option, "maxschedchunk", "") is None:
        config.option.maxschedchunk = 1


LONG_RUNNING = {
    "tests/packaging/test_installed_wheel.py": 150,
    "stateful_tests/test_manager_machine.py": 50,
    "tests/harness/test_kill_matrix.py": 30,
    "stateful_tests/test_manager_machine_catches_seed_bugs.py": 30,
    "tests/campaign/test_campaign.py": 25,
    "tests/harness/test_explore.py": 25,
    "stateful_tests/test_free_queue_machine.py": 20,
    "stateful_tests/test_block_pool_machine.py": 20,
    "tests/harness/test_fast_swarm.py": 20,
}
"""Modules holding tests that take tens of seconds or more on two cores (the longest of each, roughly,
in seconds).  Scheduling only: they run first, longest first, so that no worker is left with one of
them while the other has nothing to do."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath

    def seconds(item: pytest.Item) -> int:
        return LONG_RUNNING.get(item.path.relative_to(root).as_posix(), 0) if item.path.is_relative_to(root) else 0

    items.sort(key=lambda item: -seconds(item))
