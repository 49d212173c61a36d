"""One KV-cache group of a target configuration: its kind, reach, block size and dtype, and its checks."""

from __future__ import annotations

from typing import Any

import attrs

from kvmodel.config_checks import ConfigError, check_declared
from kvmodel.fields import Declaration, declared, to_json
from kvmodel.kinds import GROUP_KINDS, Kind, kind_named, kind_names
from kvmodel.limits import MAX_BLOCK_SIZE, MAX_SPECULATIVE_BLOCKS, MAX_WINDOW_TOKENS, shown

KV_CACHE_DTYPES = ("auto", "fp8")
"""A group's KV cache dtype: the model's (``auto``) or 8-bit floats (vLLM's ``--kv-cache-dtype fp8``)."""


@attrs.frozen(kw_only=True)
class GroupSpec:
    """One KV-cache group: its attention kind and, for local kinds, the reach in tokens.

    ``window`` is the sliding window (``sliding_window``), the attention
    chunk (``chunked_local``) or the generated tokens an R-SWA group keeps
    beside the prompt (``rswa``), in tokens; ``None`` for the other kinds:
    ``full``, ``mla`` (multi-head latent attention: full attention of a spec
    of its own), ``ring`` (a ring buffer: one scratch block per request),
    ``cross_attention`` (blocks for the encoder's tokens), ``mamba`` (a
    Mamba state group in vLLM's ``none`` cache mode: the block holding the
    last computed token's state is kept, every one before it freed) and
    ``mamba_align`` (a Mamba state group in vLLM's ``align`` mode: position
    ``p`` holds the state after ``(p + 1) * block_size`` tokens, a step
    reaching a new block gets one there and null blocks before it, full
    blocks' states are prefix-cached and a hit needs only its last state).

    ``speculative_blocks`` (Mamba kinds only) is how many blocks past the
    slots every allocation reserves for the states of draft tokens; in the
    align mode they follow the last state, and a step whose new state
    positions pass over them moves them to the table's end.

    ``block_size`` is the group's own block size, when it differs from the
    cache's (``None``: the cache's ``block_size``).

    ``dcp_replicated`` keeps the group's blocks whole on every decode context
    parallel rank (a draft model running at DCP 1 beside a sharded target);
    only attention groups are sharded at all.

    ``kv_cache_dtype`` is the dtype of an attention group's KV cache
    (:data:`KV_CACHE_DTYPES`); attention groups of different dtypes make the
    worker zero every new block (:attr:`TargetConfig.needs_zeroing`).

    ``prefill_checkpoint_alignment`` (``mamba_align`` only) gives the group
    a prefill checkpoint block (vLLM's ``num_prefill_checkpoint_blocks=1``)
    and the token grid, counted from a chunk's start, that its backend can
    export a state on inside the chunk (vLLM's
    ``prefill_checkpoint_alignment``); ``None``: no checkpoint block.
    """

    kind: str = declared(Declaration(holds="choice", choices=GROUP_KINDS))
    window: int | None = declared(
        Declaration(holds="integer", minimum=None, maximum=MAX_WINDOW_TOKENS, unit="tokens"), default=None
    )
    speculative_blocks: int = declared(
        Declaration(holds="integer", maximum=MAX_SPECULATIVE_BLOCKS, spelled_as_range=True), default=0
    )
    block_size: int | None = declared(Declaration(holds="integer", minimum=1, maximum=MAX_BLOCK_SIZE), default=None)
    dcp_replicated: bool = declared(Declaration(holds="flag"), default=False)
    kv_cache_dtype: str = declared(Declaration(holds="choice", choices=KV_CACHE_DTYPES), default="auto")
    prefill_checkpoint_alignment: int | None = declared(
        Declaration(holds="integer", minimum=1, maximum=MAX_BLOCK_SIZE, unit="tokens", spelled_as_range=True),
        default=None,
    )

    def validate(self, block_size: int, where: str) -> None:
        check_declared(self, f"{where}.")
        if self.block_size is not None:
            block_size = self.block_size
        rules = self.rules
        if self.dcp_replicated and rules.holds_state:
            raise ConfigError(f"{where}.dcp_replicated", f"true for a {self.kind} group, whose state is never sharded")
        if self.kv_cache_dtype != "auto" and rules.holds_state:
            raise ConfigError(
                f"{where}.kv_cache_dtype",
                f"{self.kv_cache_dtype} for a {self.kind} group, which holds states, not a KV cache",
            )
        alignment = self.prefill_checkpoint_alignment
        if alignment is not None and not rules.aligned_states:
            raise ConfigError(
                f"{where}.prefill_checkpoint_alignment",
                f"only a {kind_names(lambda kind: kind.aligned_states)} group has prefill checkpoints, "
                f"got {shown(alignment)}",
            )
        if not rules.holds_state and self.speculative_blocks != 0:
            raise ConfigError(
                f"{where}.speculative_blocks",
                f"only a {kind_names(lambda kind: kind.holds_state)} group has speculative blocks, "
                f"got {shown(self.speculative_blocks)}",
            )
        field = f"{where}.window"
        if not rules.has_window:
            if self.window is not None:
                raise ConfigError(field, f"a {self.kind} group has no window, got {shown(self.window)}")
            return
        if self.window is None:
            raise ConfigError(field, f"must be an integer number of tokens, got {shown(self.window)}")
        wrong = rules.validate_window(self.window, block_size)
        if wrong is not None:
            raise ConfigError(field, wrong)

    @property
    def rules(self) -> Kind:
        """The group's kind: its traits and its model rules (:mod:`kvmodel.kinds`)."""
        return kind_named(self.kind)

    def first_attended_token(self, num_computed_tokens: int) -> int:
        """The first token that the token after ``num_computed_tokens`` computed ones attends to: token 0
        for full attention, the window's or the chunk's first for local attention, the last computed
        token for a Mamba state.  Every token before it is skipped: no later token reads it."""
        return self.rules.first_attended_token(self, num_computed_tokens)

    def released_blocks(self, num_computed_tokens: int, num_prompt_tokens: int, block_size: int) -> range:
        """The table positions no future token reads once ``num_computed_tokens`` are processed, of a
        request with a ``num_prompt_tokens``-token prompt: the whole blocks before the first attended
        token, or for R-SWA those between the prompt's last block and the window's first token."""
        return self.rules.released_blocks(self, num_computed_tokens, num_prompt_tokens, block_size)

    def describe(self) -> str:
        """The kind, with its window or speculative blocks, its own block size and whether DCP leaves it
        whole: ``sliding_window(4)``, ``mamba(+2 speculative)``, ``full/8``, ``full replicated``."""
        size = "" if self.block_size is None else f"/{self.block_size}"
        if self.dcp_replicated:
            size += " replicated"
        if self.kv_cache_dtype != "auto":
            size += f" {self.kv_cache_dtype}"
        if self.window is not None:
            return f"{self.kind}({self.window}){size}"
        if self.prefill_checkpoint_alignment is not None:
            size += f" checkpoints/{self.prefill_checkpoint_alignment}"
        if self.speculative_blocks:
            return f"{self.kind}(+{self.speculative_blocks} speculative){size}"
        return self.kind + size

    def to_json(self) -> dict[str, Any]:
        """The group as a trace writes it (:func:`kvmodel.fields.to_json`)."""
        return to_json(self)
