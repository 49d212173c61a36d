"""Input limits: the largest values a trace, a target configuration or a command-line option may hold.

Every limit lives here, so that the configuration check, the trace loader,
the command line and ``trace.schema.json`` agree (a test compares the schema
with these constants).  The limits sit well above anything the machines, the
swarm driver or the corpus produce (pools of at most 32 blocks of 1 to 4
tokens, at most 8 groups, prompts of a few hundred tokens at most, traces of
at most 80 steps), and low enough that replaying or showing the worst trace
they admit takes under a minute and under half a gigabyte on a two-core
machine (though ``kvcheck show`` of it prints several hundred megabytes).

The limits bound each other's cost, so they are tighter together than each
would need alone: every step observes and compares the whole state (the
pool, every table, every cache entry, whose key is its whole token prefix),
the reference model's prefix-hit search grows with the cube of a waiting
request's length, and ``kvcheck show`` keeps every step's state.  Pool size,
prompt length, prompt tokens in all and steps therefore multiply.
"""

from __future__ import annotations

MAX_TRACE_BYTES = 4 * 1024 * 1024
"""Size of a trace file, checked before it is read."""

MAX_NUM_BLOCKS = 256
"""``config.num_blocks``: blocks in the pool, the null block included."""

MAX_BLOCK_SIZE = 1024
"""``config.block_size``: tokens per block."""

MAX_GROUPS = 8
"""Entries of ``config.groups``, and ``--groups``."""

MAX_DCP_WORLD_SIZE = 16
"""``config.dcp_world_size``: ranks a block's tokens are sharded over."""

MAX_SPECULATIVE_BLOCKS = 8
"""``config.groups[i].speculative_blocks``: the most a Mamba group reserves (vLLM reserves one per draft token)."""

MAX_WINDOW_TOKENS = 1024 * 1024
"""``config.groups[i].window``: a sliding window or an attention chunk, in tokens."""

MAX_OPS = 500
"""Operations in a trace."""

MAX_PROMPT_TOKENS = 512
"""Tokens in one ``add_request`` prompt."""

MAX_TRACE_PROMPT_TOKENS = 4096
"""Tokens in all the ``add_request`` prompts of a trace together."""

MAX_TOKEN_ID = 2**31 - 1
"""A token id: a prompt token or a ``sampled_token``."""

MAX_LOOKAHEAD_TOKENS = 64
"""``config.num_lookahead_tokens``: slots reserved past each step for a drafter's tokens."""

MAX_DRAFT_TOKENS = 64
"""``num_draft_tokens`` and ``num_accepted_tokens`` of one ``spec_decode``."""

MAX_SCHEDULE_TOKENS = 65536
"""``num_new_tokens`` and ``num_external_tokens`` of one ``schedule``."""

MAX_EVICT_BLOCK_IDS = MAX_NUM_BLOCKS
"""Block ids in one ``evict_blocks`` (there are no more blocks than this to evict)."""

MAX_REQUEST_ID_CHARS = 256
"""Characters in a ``request_id``."""

MAX_SWARM_RUNS = 1_000_000
"""``kvcheck run --swarm-runs`` and ``kvcheck kill-matrix --runs``."""

MAX_FULL_CHECK_EVERY = 1000
"""``--full-check-every``: steps between two full checks of the swarm driver's state."""

MAX_SEED = 2**32 - 1
"""``kvcheck run --seed``."""

MAX_KILL_MATRIX_SEEDS = 100
"""``kvcheck kill-matrix --seeds``: swarm seeds per fault."""


def shown(value: object, width: int = 60) -> str:
    """``repr(value)`` for a one-line message, its middle cut out when it is long."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # nested deeper than repr goes, or an int too long to print
        return f"a {type(value).__name__} too deep or too long to show"
    if len(text) <= width:
        return text
    unit = "digits" if isinstance(value, int) else "characters"
    return f"{text[: width - 20]}...{text[-12:]} ({len(text):,} {unit})"


def above(value: int, limit: int, unit: str = "") -> str:
    """The refusal of a value above its limit, e.g. ``70000 tokens is above the limit of 1024``."""
    return f"{shown(value)}{' ' + unit if unit else ''} is above the limit of {limit}"
