"""Hypothesis strategies for target configurations and request contents."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from kvcheck.config_space import random_config
from kvmodel.config import TargetConfig

MAX_LIVE_REQUESTS = 6
TOKEN_ALPHABET = 3
"""Prompts draw from a tiny alphabet so that prefixes collide and hits happen often."""


MAMBA_LAYOUT_SHARES = {"block_sizes_share": 2 / 3, "dcp_share": 0.6}
"""The shares the Mamba layouts' run draws with (twice the defaults of
:func:`~kvcheck.config_space.random_config`): its rarest states, a hit ending inside a drafter's block
after its one-hash-block drop and a state hit ending inside a block sharded over DCP ranks, need hashes
finer than the blocks or several ranks."""


def target_configs(
    num_groups: int | str | None = None,
    full_pool: bool = False,
    caching: bool | None = None,
    drafter_and_async: bool = True,
) -> st.SearchStrategy[TargetConfig]:
    """Configurations of :func:`kvcheck.config_space.random_config`, drawn from a seed (``num_groups``
    fixes the group count, or names the layout of every draw, such as ``"mamba"``).

    Hypothesis draws the seed, not the fields: a mutated seed is a wholly
    different configuration, so one run of a few hundred examples visits
    many layouts instead of variations of a few.  Configurations are shrunk
    by kvcheck's trace shrinker, which simplifies groups, pool and windows.
    """
    layout = num_groups if isinstance(num_groups, str) else None
    count = None if isinstance(num_groups, str) else num_groups
    shares = MAMBA_LAYOUT_SHARES if layout == "mamba" else {}
    return st.integers(0, 2**32 - 1).map(
        lambda seed: random_config(
            random.Random(seed), count, full_pool, caching, drafter_and_async, layout=layout, **shares
        )
    )


prompts = st.lists(st.integers(0, TOKEN_ALPHABET - 1), min_size=1, max_size=8).map(tuple)
tokens = st.integers(0, TOKEN_ALPHABET - 1)


def block_aligned_prompts(block_size: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Prompts of 1 to 4 whole blocks."""
    return (
        st.integers(1, 4)
        .flatmap(
            lambda num_blocks: st.lists(tokens, min_size=num_blocks * block_size, max_size=num_blocks * block_size)
        )
        .map(tuple)
    )
