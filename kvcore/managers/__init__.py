"""One manager per attention type; each keeps the block tables of one KV-cache group."""

from kvcore.config import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from kvcore.managers.base import SingleTypeManager
from kvcore.managers.chunked_local import ChunkedLocalAttentionManager
from kvcore.managers.full import FullAttentionManager
from kvcore.managers.mamba import AlignedMambaManager, MambaManager
from kvcore.managers.rswa import RSWAManager
from kvcore.managers.scratch import CircularBufferManager, CrossAttentionManager
from kvcore.managers.sliding_window import SlidingWindowManager

MANAGER_FOR_SPEC: dict[type, type[SingleTypeManager]] = {
    FullAttentionSpec: FullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    RSWASpec: RSWAManager,
    CircularBufferSpec: CircularBufferManager,
    CrossAttentionSpec: CrossAttentionManager,
    MLAAttentionSpec: FullAttentionManager,
    MambaSpec: MambaManager,
    SlidingWindowMLASpec: SlidingWindowManager,
}


def manager_class_for(spec: AttentionSpec) -> type[SingleTypeManager]:
    """The manager class that implements ``spec``'s attention type (and a Mamba group's cache mode)."""
    if isinstance(spec, MambaSpec) and spec.aligned:
        return AlignedMambaManager
    return MANAGER_FOR_SPEC[type(spec)]


__all__ = [
    "AlignedMambaManager",
    "ChunkedLocalAttentionManager",
    "CircularBufferManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaManager",
    "RSWAManager",
    "SingleTypeManager",
    "SlidingWindowManager",
    "manager_class_for",
]
