"""The drift detector on the installed vLLM: a recording of the corpus and a few swarm runs compares alike
with itself, and a recording changed at one step is reported at that step.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.cli import default_corpus
from kvcheck.drift import compare, record


def test_a_recording_is_alike_itself_and_a_changed_step_is_reported() -> None:
    corpus = sorted(default_corpus().glob("s00*.json"))
    document = record(corpus, seed=3, swarm_runs=5)
    assert [run["name"] for run in document["runs"]][:2] == [path.name for path in corpus]
    assert len(document["runs"]) == len(corpus) + 5
    assert compare(document, copy.deepcopy(document)) == []
    changed = copy.deepcopy(document)
    step = changed["runs"][0]["steps"][1]
    step["state"]["free_order"] = [*reversed(step["state"]["free_order"]), 99]
    (drift,) = compare(document, changed)
    assert (drift.run, drift.step, drift.field) == (corpus[0].name, 2, "state.free_order")
