"""Traces written by earlier kvcheck releases still load and replay to the verdict they recorded.

``old_traces/COMMIT/`` holds traces as the trace writer of kvcheck at that commit wrote them (each the
shrunk trace of its kill matrix, tagged with the fault and the invariant it failed): ``faa62e1`` the
first trace format (four configuration fields), ``1af1216`` with an EAGLE drafter, ``0628fe8`` with
steps in flight, deferred frees and decode context parallelism.  Fields declared since then read as their
defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcheck.replay import replay, resolve_target
from kvcheck.trace import load_trace

OLD_TRACES = sorted(Path(__file__).with_name("old_traces").glob("*/*.json"))
IDS = [f"{path.parent.name}-{path.stem}" for path in OLD_TRACES]


def test_old_traces_are_kept_from_three_releases() -> None:
    assert len({path.parent.name for path in OLD_TRACES}) == 3, OLD_TRACES


@pytest.mark.parametrize("path", OLD_TRACES, ids=IDS)
def test_an_old_trace_replays_clean_and_fails_as_recorded_under_its_fault(path: Path) -> None:
    trace = load_trace(path)
    assert trace.expect is not None and trace.expect.fault is not None
    clean = replay(trace, resolve_target("kvcore"))
    assert clean.violation is None, f"{path}: {clean.violation}"
    planted = replay(trace, resolve_target("kvcore", trace.expect.fault))
    assert planted.violation is not None, f"{path}: nothing failed under {trace.expect.fault}"
    assert planted.violation.invariant == trace.expect.invariant, f"{path}: {planted.violation}"


@pytest.mark.parametrize("path", OLD_TRACES, ids=IDS)
def test_an_old_trace_is_written_back_as_it_was_read(path: Path) -> None:
    """What an old trace states is kept: written again, it holds the same configuration and operations
    (fields declared since then stay out, at their defaults)."""
    trace = load_trace(path)
    old = json.loads(path.read_text())
    new = json.loads(trace.dumps())
    assert new["config"] == old["config"]
    assert new["ops"] == old["ops"]
