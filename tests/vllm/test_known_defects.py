"""Defects of vLLM's allocator that kvcheck found and steers its random configurations around
(kvcheck/known_defects.py): each pinned on the installed release.

On a release kvcheck knows, each defect shows exactly where its record says it is present: when a
release fixes one, its record moves and the restriction it names in the config space can go.  On a
release kvcheck does not know, a defect that no longer shows is news, reported by a skip, not a failure.
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.known_defects import DEFECTS, KnownDefect
from kvcheck.targets.vllm_target import require_vllm


@pytest.mark.parametrize("defect", DEFECTS, ids=[defect.name for defect in DEFECTS])
def test_a_known_defect_shows_where_its_record_says(defect: KnownDefect) -> None:
    semantics = require_vllm().semantics
    shows = defect.reproduce()
    if semantics.unconfirmed is not None:
        if not shows:
            pytest.skip(f"{defect.name} no longer shows on vLLM {semantics.installed}: news ({semantics.unconfirmed})")
        return
    assert shows == (semantics.release in defect.present_in), (
        f"{defect.name}: recorded as {'present' if semantics.release in defect.present_in else 'fixed'} in vLLM "
        f"{semantics.release}, but it {'shows' if shows else 'does not show'}"
    )
