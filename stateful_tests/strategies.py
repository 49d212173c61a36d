"""Hypothesis strategies for target configurations and request contents."""

from __future__ import annotations

from hypothesis import strategies as st

from kvcheck.config import GroupSpec, TargetConfig

MAX_LIVE_REQUESTS = 6
TOKEN_ALPHABET = 3
"""Prompts draw from a tiny alphabet so that prefixes collide and hits happen often."""


@st.composite
def group_specs(draw: st.DrawFn, block_size: int) -> GroupSpec:
    kind = draw(st.sampled_from(["full", "sliding_window", "chunked_local"]))
    if kind == "sliding_window":
        # Short windows slide within a short run; long ones keep hits intact.
        return GroupSpec(kind, draw(st.integers(2, 4 * block_size) | st.integers(2, 16 * block_size)))
    if kind == "chunked_local":
        return GroupSpec(kind, block_size * draw(st.integers(1, 4) | st.integers(1, 16)))
    return GroupSpec(kind)


@st.composite
def local_group_specs(draw: st.DrawFn, block_size: int) -> GroupSpec:
    """A local-attention group with a window a few blocks long, as in shipped hybrid models."""
    if draw(st.booleans()):
        return GroupSpec("sliding_window", draw(st.integers(2, 4 * block_size)))
    return GroupSpec("chunked_local", block_size * draw(st.integers(1, 4)))


@st.composite
def target_configs(draw: st.DrawFn, num_groups: int | None = None) -> TargetConfig:
    """Small pools (4..32 blocks of 1..4 tokens) shared by 1..4 groups of mixed kinds."""
    # One-token blocks make every computed block full and cached, so the free
    # queue fills with cached blocks: where reuse-order bugs show.
    block_size = draw(st.sampled_from([1, 1, 1, 2, 3, 4]))
    count = num_groups if num_groups is not None else draw(st.integers(1, 4))
    if count > 1 and draw(st.booleans()):
        # Laid out like a shipped hybrid model (Gemma 3, Llama 4): full attention
        # first, then local layers whose short windows drop blocks early, so a
        # prefix hit leaves some of each local group's blocks in the free queue.
        groups = (GroupSpec("full"), *(draw(local_group_specs(block_size)) for _ in range(count - 1)))
    else:
        groups = tuple(draw(group_specs(block_size)) for _ in range(count))
    return TargetConfig(
        # Half the pools are large enough for a long prefill to leave room after
        # its windows dropped blocks; tiny pools keep exhaustion frequent.
        num_blocks=draw(st.integers(4, 32) | st.integers(16, 32)),
        block_size=block_size,
        groups=groups,
        enable_caching=draw(st.booleans()),
    )


prompts = st.lists(st.integers(0, TOKEN_ALPHABET - 1), min_size=1, max_size=8).map(tuple)
tokens = st.integers(0, TOKEN_ALPHABET - 1)
