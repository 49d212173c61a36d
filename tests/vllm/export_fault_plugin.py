"""A pytest plugin that plants a catalogued vLLM fault into every KVCacheManager a test builds.

For the tests of ``kvcheck export``: an exported file runs in a pytest subprocess on the installed vLLM,
whose files are never edited.  Load it with ``-p export_fault_plugin`` (its folder on ``PYTHONPATH``).

- ``KVCHECK_EXPORT_FAULT=NAME`` plants ``kvcheck.faults.VLLM_FAULTS[NAME]`` into every manager;
- ``KVCHECK_EXPORT_FAULTS=FILE=NAME,FILE=NAME`` plants, per test file (named by its file name), that
  file's fault (files not named get ``KVCHECK_EXPORT_FAULT``'s, if any), so that one pytest run
  checks many exports, each under its own fault.

``KVCacheManager.__init__`` is wrapped for the session: each manager built gets the fault's ``plant``
applied to it alone, as ``VllmTarget(config, plant=...)`` does.  Without either variable the plugin
does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

FAULT_VARIABLE = "KVCHECK_EXPORT_FAULT"
FAULTS_BY_FILE_VARIABLE = "KVCHECK_EXPORT_FAULTS"

_default_fault: str | None = None
_current_fault: str | None = None
_faults_by_file: dict[str, str] = {}


def parse_faults_by_file(text: str) -> dict[str, str]:
    """``FILE=NAME,FILE=NAME`` as a dict from file name to fault name."""
    mapping = {}
    for entry in filter(None, text.split(",")):
        file_name, separator, fault = entry.partition("=")
        if not separator or not file_name or not fault:
            raise pytest.UsageError(f"{FAULTS_BY_FILE_VARIABLE}: expected FILE=NAME entries, got {entry!r}")
        mapping[file_name] = fault
    return mapping


def pytest_configure(config: pytest.Config) -> None:
    global _default_fault, _current_fault, _faults_by_file
    _default_fault = _current_fault = os.environ.get(FAULT_VARIABLE) or None
    _faults_by_file = parse_faults_by_file(os.environ.get(FAULTS_BY_FILE_VARIABLE, ""))
    if _current_fault is None and not _faults_by_file:
        return
    from kvcheck.faults import VLLM_FAULTS

    named = {*_faults_by_file.values(), *([_default_fault] if _default_fault else [])}
    unknown = sorted(named - VLLM_FAULTS.keys())
    if unknown:
        raise pytest.UsageError(f"unknown vLLM fault(s) {', '.join(unknown)}; known: {', '.join(VLLM_FAULTS)}")
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    original_init: Callable[..., None] = KVCacheManager.__init__

    def init_with_fault(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if _current_fault is not None:
            VLLM_FAULTS[_current_fault].plant(self)

    KVCacheManager.__init__ = init_with_fault  # type: ignore[method-assign]
    config.add_cleanup(lambda: setattr(KVCacheManager, "__init__", original_init))


def pytest_runtest_setup(item: pytest.Item) -> None:
    global _current_fault
    _current_fault = _faults_by_file.get(item.path.name, _default_fault)
