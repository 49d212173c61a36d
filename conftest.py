"""The checkout's tests: kvcheck's pytest plugin (installed with the package) supplies the options
(``--kvcheck-target`` ...), the target fixture and the repro hook; this file adds the options' short
spellings (``--target``, ``--fault``, ``--groups``, ``--repros``) and loads the Hypothesis profile for
every test here.

Hypothesis profiles (``dev``, ``ci``, ``thorough``) are defined in
:mod:`kvcheck.stateful_tests.profiles`; choose one with ``--hypothesis-profile NAME``
or ``HYPOTHESIS_PROFILE=NAME`` (``ci`` is the default when CI is set).
"""

from __future__ import annotations

import pytest

from kvcheck.pytest_plugin import add_options
from kvcheck.stateful_tests.profiles import register_profiles


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser, "")


def pytest_configure(config: pytest.Config) -> None:
    register_profiles(config.getoption("hypothesis_profile", default=None))
