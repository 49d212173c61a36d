"""The drift detector's file format and comparison, on recordings made here by hand (recording needs vLLM:
tests/vllm/test_vllm_drift.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kvcheck.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_VIOLATION, main
from kvcheck.drift import FORMAT, VERSION, Drift, DriftFileError, canonical, compare, read
from kvcheck.trace import Trace
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.ops import AddRequest, Schedule

TRACE = Trace(
    TargetConfig(num_blocks=4, block_size=1, groups=(GroupSpec(kind="full"),), enable_caching=True),
    (AddRequest("a", (0, 1)), Schedule("a", 2, 0, 0)),
)


def recording(vllm: str, free_order: list[int]) -> dict[str, Any]:
    steps = [
        {"op": "add_request(a)", "result": {"admitted": None}, "state": {"free_order": [1, 2, 3]}},
        {"op": "schedule(a)", "result": {"admitted": True}, "state": {"free_order": free_order}},
    ]
    run = {"name": "r", "trace": TRACE.to_json(), "steps": steps}
    return {"format": FORMAT, "version": VERSION, "vllm": vllm, "semantics": "0.33.0", "runs": [run]}


def test_the_first_differing_step_and_field_of_each_run_is_reported() -> None:
    assert compare(recording("0.33.0", [2, 3]), recording("0.34.0", [2, 3])) == []
    assert compare(recording("0.33.0", [2, 3]), recording("0.34.0", [3, 2])) == [
        Drift("r", 2, "schedule(a)", "state.free_order", "[2, 3]", "[3, 2]")
    ]


def test_recordings_of_other_runs_or_other_calls_are_refused() -> None:
    other_ops = recording("0.34.0", [2, 3])
    other_ops["runs"][0]["trace"]["ops"] = other_ops["runs"][0]["trace"]["ops"][:1]
    with pytest.raises(DriftFileError, match="run r: not recorded from the same operations"):
        compare(recording("0.33.0", [2, 3]), other_ops)
    other_calls = copy.deepcopy(recording("0.34.0", [2, 3]))
    other_calls["semantics"] = "0.34.0"
    with pytest.raises(DriftFileError, match="different scheduler semantics"):
        compare(recording("0.33.0", [2, 3]), other_calls)


def test_canonical_values_have_one_order() -> None:
    assert canonical({"b": frozenset({3, 1}), "a": (1, 2)}) == [["a", [1, 2]], ["b", [1, 3]]]


def test_the_cli_compares_files_and_names_a_bad_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second, bad = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "bad.json"
    first.write_text(json.dumps(recording("0.33.0", [2, 3])))
    second.write_text(json.dumps(recording("0.34.0", [3, 2])))
    bad.write_text(json.dumps({"format": FORMAT, "version": VERSION, "vllm": "0.34.0", "semantics": "0.33.0"}))
    before = bad.read_text()
    assert main(["drift", "compare", str(first), str(first)]) == EXIT_OK
    assert main(["drift", "compare", str(first), str(second)]) == EXIT_VIOLATION
    assert "r: step 2 (schedule(a)): state.free_order: [2, 3] != [3, 2]" in capsys.readouterr().out
    assert main(["drift", "compare", str(first), str(bad)]) == EXIT_BAD_INPUT
    assert f"{bad}: field 'runs' is missing" in capsys.readouterr().err
    assert bad.read_text() == before
    with pytest.raises(DriftFileError, match="not a drift file"):
        read(_write(tmp_path / "x.json", {"format": "other"}))


def _write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path
