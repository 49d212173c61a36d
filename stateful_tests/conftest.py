"""The suite's own collection settings: its Hypothesis profile, and the layouts and allocators
its machines run with.  (The options and the target fixture are kvcheck's pytest plugin.)"""

from __future__ import annotations

import pytest

from kvcheck.coverage.labels import GROUP_LAYOUTS
from kvcheck.profiles import register_profiles
from kvcheck.targets import component_allocators


def pytest_configure(config: pytest.Config) -> None:
    register_profiles(config.getoption("hypothesis_profile", default=None))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "allocator" in metafunc.fixturenames:
        _parametrize_allocators(metafunc)
    if "num_groups" not in metafunc.fixturenames:
        return
    groups: int | None = metafunc.config.getoption("kvcheck_groups")
    if groups is not None and not 1 <= groups <= 8:
        raise pytest.UsageError(f"--groups={groups}: must be between 1 and 8")
    layouts = GROUP_LAYOUTS if groups is None else (groups,)
    ids = ["groups-1-to-4" if n is None else f"layout-{n}" if isinstance(n, str) else f"groups-{n}" for n in layouts]
    metafunc.parametrize("num_groups", layouts, ids=ids)


def _parametrize_allocators(metafunc: pytest.Metafunc) -> None:
    """The free-queue and block-pool machines run on each built-in allocator that --target names."""
    spec = metafunc.config.getoption("kvcheck_target")
    allocators = component_allocators(spec)
    if allocators:
        metafunc.parametrize("allocator", allocators)
        return
    reason = f"--target {spec} names no built-in allocator; its free queue and block pool have no target"
    metafunc.parametrize("allocator", [pytest.param(spec, marks=pytest.mark.skip(reason=reason))])
