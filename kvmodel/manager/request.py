"""A request as the manager model holds it: its tokens, how far it is computed, and its state."""

from __future__ import annotations

import attrs


@attrs.define(eq=False)
class RequestModel:
    request_id: str
    tokens: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    num_in_flight_tokens: int = 0
    running: bool = False
    loading: bool = False
    waiting: bool = True
    """New or preempted, and not admitted since (vLLM's WAITING and PREEMPTED)."""
    shared_prefix_boundary: int = 0
    """Set by each lookup: the end of the longer prefix a group found cached when the hit fell short of
    it (0 when none did)."""
    max_draft_tokens: int = 0
    state_tokens: int | None = None
    """The tokens the request's last step ran up to, drafts included (``None``: none since it was
    admitted): an align-mode Mamba group's state is saved in that step's last block."""
    """The most draft tokens a speculative decode step of the request scheduled (0: it ran none)."""
