"""What every group kind declares: its traits (what it is) and its rules (what the model does with it).

A kind module subclasses :class:`Kind` and overrides the traits and rules in which its kind differs
from full attention, the plainest kind: every block from the first is attended to, hit and cached.
"""

from __future__ import annotations

from typing import ClassVar, Protocol


class Group(Protocol):
    """What a kind's rules read of a group: its reach in tokens, and its speculative blocks."""

    @property
    def window(self) -> int | None: ...

    @property
    def speculative_blocks(self) -> int: ...


def ceil_div(n_tokens: int, block_size: int) -> int:
    """The blocks of ``block_size`` tokens that hold ``n_tokens`` tokens."""
    return -(-n_tokens // block_size)


class Kind:
    """One group kind: its name, its traits and its model rules."""

    in_prefix_cache: ClassVar[bool] = True
    """Its blocks are cached and hit (not a ring's scratch block nor cross-attention's encoder blocks)."""
    full_hit: ClassVar[bool] = False
    """Its prefix hit is full attention's: every block from the first on."""
    has_window: ClassVar[bool] = False
    """Its group has a ``window`` in tokens: a sliding window, an attention chunk, an R-SWA window."""
    local_attention: ClassVar[bool] = False
    """It attends to recent tokens only (a sliding window or an attention chunk): a waiting request's
    admission counts at most what it holds at once, and vLLM 0.33.0 looks its hits up only unsharded."""
    sliding: ClassVar[bool] = False
    """A sliding window (plain, or over MLA's latent vectors): caches only what a hit needs under a
    retention interval."""
    chunked: ClassVar[bool] = False
    """Chunked local attention: its hits align to its own blocks and cannot drop a block."""
    holds_state: ClassVar[bool] = False
    """It holds Mamba states, not a KV cache: never sharded, zeroed in every cache, with speculative blocks."""
    aligned_states: ClassVar[bool] = False
    """Its state after ``(p + 1) * block_size`` tokens sits at position ``p``, prefix-cached (vLLM's Mamba
    ``align`` mode): a hit needs only its last state, and a group may have prefill checkpoints."""
    scratch_block: ClassVar[bool] = False
    """A ring buffer: one scratch block per request, never zeroed nor written by a connector's load."""
    keeps_prompt: ClassVar[bool] = False
    """R-SWA: it keeps the whole prompt beside its window of generated tokens."""
    encoder_blocks: ClassVar[bool] = False
    """Cross-attention: blocks for the encoder's tokens, given as a request is scheduled from waiting."""
    caching_off_reason: ClassVar[str | None] = None
    """Why vLLM 0.33.0 runs the kind only with prefix caching off, or ``None`` when it runs it with it on."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<kind {self.name}>"

    # -- validation -----------------------------------------------------------

    def validate_window(self, window: int, block_size: int) -> str | None:
        """What is wrong with an integer ``window`` of a group of this kind in blocks of ``block_size``
        tokens (a kind with a window), or ``None`` when it is right."""
        return None

    # -- rules ----------------------------------------------------------------

    def first_attended_token(self, group: Group, num_computed_tokens: int) -> int:
        """The first token that the token after ``num_computed_tokens`` computed ones attends to; every
        token before it is skipped: no later token reads it."""
        return 0

    def released_blocks(self, group: Group, num_computed_tokens: int, num_prompt_tokens: int, block_size: int) -> range:
        """The table positions no future token reads once ``num_computed_tokens`` are processed, of a
        request with a ``num_prompt_tokens``-token prompt: the whole blocks before the first attended token."""
        return range(self.first_attended_token(group, num_computed_tokens) // block_size)

    def needed_positions(self, group: Group, hit_blocks: int, block_size: int) -> range:
        """Block positions a hit of ``hit_blocks`` blocks must find cached: every block before the boundary."""
        return range(hit_blocks)

    def slot_blocks(self, group: Group, num_tokens: int, block_size: int, encoder_blocks: int) -> int:
        """The table length that gives ``num_tokens`` slots: a block per ``block_size`` slots, and the
        group's speculative blocks past them.  ``encoder_blocks`` is what a cross-attention table holds
        at this allocation."""
        return ceil_div(num_tokens, block_size) + group.speculative_blocks

    def admission_cap(self, group: Group, max_in_flight_tokens: int, block_size: int) -> int | None:
        """Blocks a request holds at once with ``max_in_flight_tokens`` tokens in flight, in blocks of
        ``block_size`` tokens, or ``None`` when it holds all it has."""
        return None
