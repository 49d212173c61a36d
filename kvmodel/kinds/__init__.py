"""The group kinds, one module per kind or family of closely related kinds, found by name here.

Each kind is a :class:`~kvmodel.kinds.base.Kind`: its traits and its model rules.  The tuples below
name the kinds sharing a trait, for code that lists them (validation messages, draws, coverage).
"""

from __future__ import annotations

from collections.abc import Callable

from kvmodel.kinds import chunked_local, cross_attention, full, mamba, ring, rswa, sliding_window
from kvmodel.kinds.base import Kind

KINDS: dict[str, Kind] = {
    kind.name: kind
    for module in (full, sliding_window, chunked_local, rswa, ring, cross_attention, mamba)
    for kind in module.KINDS
}
"""Every group kind by name, in the order configurations list them."""


def kind_named(name: str) -> Kind:
    """The kind called ``name``."""
    return KINDS[name]


def names_where(trait: Callable[[Kind], bool]) -> tuple[str, ...]:
    """The names of the kinds with ``trait``, in registry order."""
    return tuple(name for name, kind in KINDS.items() if trait(kind))


GROUP_KINDS = tuple(KINDS)
SLIDING_KINDS = names_where(lambda kind: kind.sliding)
"""The sliding-window kinds: plain, and over MLA's latent vectors (a spec of its own)."""
WINDOW_KINDS = names_where(lambda kind: kind.has_window)
"""The kinds whose group has a ``window``: a sliding window, an attention chunk, an R-SWA window."""
FULL_HIT_KINDS = names_where(lambda kind: kind.full_hit)
"""The kinds whose prefix hit is full attention's (every block from the first on)."""
UNCACHED_KINDS = names_where(lambda kind: not kind.in_prefix_cache)
"""The kinds outside the prefix cache: a ring buffer's one scratch block, cross-attention's encoder blocks."""
MAMBA_KINDS = names_where(lambda kind: kind.holds_state)
"""The Mamba state kinds: vLLM's ``none`` cache mode and its ``align`` mode."""
CACHING_OFF_KINDS = names_where(lambda kind: kind.caching_off_reason is not None)
"""The kinds vLLM 0.33.0 runs only with prefix caching off: cross-attention, and Mamba outside its align mode."""


def kind_names(trait: Callable[[Kind], bool]) -> str:
    """The names of the kinds with ``trait``, for a message: ``mamba or mamba_align``."""
    return " or ".join(names_where(trait))


__all__ = [
    "CACHING_OFF_KINDS",
    "FULL_HIT_KINDS",
    "GROUP_KINDS",
    "KINDS",
    "MAMBA_KINDS",
    "SLIDING_KINDS",
    "UNCACHED_KINDS",
    "WINDOW_KINDS",
    "Kind",
    "kind_named",
    "kind_names",
    "names_where",
]
