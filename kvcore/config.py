"""Attention specs and the KV-cache configuration, as immutable values."""

from __future__ import annotations

from typing import Any

import attrs

from kvcore.errors import InvalidConfig


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidConfig(attribute.name, value, "must be an int >= 1")


@attrs.frozen
class FullAttentionSpec:
    """Full attention: every token attends to every earlier token; all blocks are kept."""

    block_size: int = attrs.field(validator=_positive_int)

    kind = "full"


@attrs.frozen
class SlidingWindowSpec:
    """Sliding-window attention: a token attends to the ``sliding_window`` tokens ending with it.

    Blocks wholly before the window of every future token are freed and
    replaced by the null block.
    """

    block_size: int = attrs.field(validator=_positive_int)
    sliding_window: int = attrs.field(validator=_positive_int)

    kind = "sliding_window"


@attrs.frozen
class ChunkedLocalAttentionSpec:
    """Chunked local attention: a token attends only to earlier tokens of its own chunk.

    Blocks before the current chunk are freed and replaced by the null block.
    """

    block_size: int = attrs.field(validator=_positive_int)
    attention_chunk_size: int = attrs.field(validator=_positive_int)

    kind = "chunked_local"


AttentionSpec = FullAttentionSpec | SlidingWindowSpec | ChunkedLocalAttentionSpec


def _groups(instance: object, attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    if len(value) < 1:
        raise InvalidConfig("groups", value, "at least one KV-cache group is needed")
    for index, spec in enumerate(value):
        if not isinstance(spec, FullAttentionSpec | SlidingWindowSpec | ChunkedLocalAttentionSpec):
            raise InvalidConfig(f"groups[{index}]", spec, "must be an attention spec")
    block_sizes = {spec.block_size for spec in value}
    if len(block_sizes) != 1:
        raise InvalidConfig("groups", value, f"all groups must share one block_size, got {sorted(block_sizes)}")


def _num_blocks(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise InvalidConfig("num_blocks", value, "must be an int >= 2 (block 0 is the null block)")


def _boolean(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidConfig(attribute.name, value, "must be True or False")


def _max_model_len(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)


@attrs.frozen
class KVCacheConfig:
    """One KV cache: a pool of ``num_blocks`` blocks shared by every group.

    ``groups`` holds one attention spec per KV-cache group (layers of one
    attention type); with more than one group the cache is *hybrid*.  All
    groups share one block size.  ``max_model_len`` bounds the token slots of
    a request (``None``: no bound).  ``use_eagle`` serves an EAGLE/MTP drafter:
    a prefix hit drops its last matched block (see :mod:`kvcore.coordinator`);
    chunked local attention cannot serve one.
    """

    num_blocks: int = attrs.field(validator=_num_blocks)
    groups: tuple[AttentionSpec, ...] = attrs.field(converter=tuple, validator=_groups)
    enable_caching: bool = attrs.field(default=True, validator=_boolean)
    max_model_len: int | None = attrs.field(default=None, validator=_max_model_len)
    use_eagle: bool = attrs.field(default=False, validator=_boolean)

    def __attrs_post_init__(self) -> None:
        if self.use_eagle and self.enable_caching:
            for index, spec in enumerate(self.groups):
                if isinstance(spec, ChunkedLocalAttentionSpec):
                    raise InvalidConfig(
                        "use_eagle", True, f"groups[{index}] is chunked local attention, whose hits cannot drop a block"
                    )

    @property
    def block_size(self) -> int:
        return self.groups[0].block_size
