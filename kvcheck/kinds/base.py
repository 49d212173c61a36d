"""What the harness needs of a group kind: the targets' specs and step positions, the search's draws, the
shrinker's simplifications and what an exported test names.

A kind module under :mod:`kvcheck.kinds` subclasses :class:`HarnessKind` once per spec and declares one
instance per kind of the reference model (:mod:`kvmodel.kinds`), whose traits the harness reads from
:attr:`HarnessKind.model`.  The model's own rules stay in the model: the block positions a step touches
are stated here again, as the targets' scheduler computes them, so that a slip on either side shows in
the lockstep.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

from kvcore.config import AttentionSpec
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import Kind


def ceil_div(n_tokens: int, block_size: int) -> int:
    """The blocks of ``block_size`` tokens that hold ``n_tokens`` tokens."""
    return -(-n_tokens // block_size)


class HarnessKind:
    """One group kind as the targets, the search, the shrinker and export use it; ``model`` is the
    reference model's kind of the same name."""

    vllm_spec_name: ClassVar[str]
    """The name of vLLM's spec class for the kind (in ``vllm.v1.kv_cache_interface``)."""
    vllm_window_field: ClassVar[str | None] = None
    """The field of vLLM's spec that takes the group's ``window``, or ``None`` for a kind without one."""
    mamba_cache_mode: ClassVar[str | None] = None
    """vLLM's ``mamba_cache_mode`` of a Mamba state kind, or ``None`` for an attention kind."""
    mixed_weight: ClassVar[int] = 0
    """How many times the mixed layouts' list of kinds names it (0: those layouts never draw it there)."""
    beside_states_weight: ClassVar[int] = 0
    """How many times the list of local-attention kinds drawn beside Mamba states names it."""
    wide_beside_states: ClassVar[bool] = False
    """Beside Mamba states it is always drawn in blocks twice the cache's block size."""
    shrinks_to_full: ClassVar[bool] = True
    """The shrinker may replace a group of the kind by a full-attention group."""

    def __init__(self, model: Kind) -> None:
        self.model = model

    @property
    def name(self) -> str:
        """The kind's name, as a trace's ``groups[i].kind`` says it."""
        return self.model.name

    def __repr__(self) -> str:
        return f"<harness kind {self.name}>"

    def group(self, **fields: Any) -> GroupSpec:
        """A group of the kind with ``fields`` (a ``window``, ``speculative_blocks``...)."""
        return GroupSpec(kind=self.name, **fields)

    # -- the targets ------------------------------------------------------------

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        """kvcore's spec of ``group``, with blocks of ``block_size`` tokens."""
        raise NotImplementedError

    def vllm_spec(self, v: Any, group: GroupSpec, layout: Mapping[str, Any]) -> Any:
        """vLLM's spec of ``group``: ``v`` holds vLLM's spec classes by name and its dtypes
        (:func:`~kvcheck.targets.vllm_target.require_vllm`), ``layout`` the block size and the layer layout."""
        window = {} if self.vllm_window_field is None else {self.vllm_window_field: group.window}
        return getattr(v, self.vllm_spec_name)(**window, **layout)

    def step_positions(
        self,
        group: GroupSpec,
        block_size: int,
        num_computed_tokens: int,
        num_new_tokens: int,
        num_prompt_tokens: int,
        num_encoder_tokens: int,
        state_tokens: int | None,
    ) -> tuple[int, ...]:
        """The block positions the scheduler's step computing ``num_new_tokens`` tokens after
        ``num_computed_tokens`` reads or writes in ``group`` (see
        :func:`~kvcheck.targets.pipeline.read_positions`): the blocks from the one holding the first token
        it reads (:meth:`first_read_token`) up to the block of the last new token."""
        end = ceil_div(num_computed_tokens + num_new_tokens, block_size)
        return tuple(range(self.first_read_token(group, num_computed_tokens) // block_size, end))

    def first_read_token(self, group: GroupSpec, num_computed_tokens: int) -> int:
        """The first token the step after ``num_computed_tokens`` computed ones reads, as the scheduler's
        model runner reads them (stated here apart from the model's rules): every token."""
        return 0

    # -- the search -------------------------------------------------------------

    def draw(self, rng: random.Random, block_size: int) -> GroupSpec:
        """A group of the kind as the mixed layouts draw it, in blocks of ``block_size`` tokens."""
        return self.group()

    def draw_short(self, rng: random.Random, block_size: int) -> GroupSpec:
        """A group of a kind with a window, the window a few blocks of ``block_size`` tokens long."""
        raise ValueError(f"a {self.name} group has no window")

    # -- the shrinker -----------------------------------------------------------

    def window_floor(self, block_size: int) -> int:
        """The smallest window the shrinker tries, in blocks of ``block_size`` tokens."""
        raise ValueError(f"a {self.name} group has no window")

    def window_step(self, block_size: int) -> int:
        """How much smaller than the window the shrinker's second try is."""
        return 1
