"""The configuration every target is built from: plain data, independent of any allocator."""

from __future__ import annotations

from typing import Any

import attrs

GROUP_KINDS = ("full", "sliding_window", "chunked_local")


class ConfigError(ValueError):
    """A target configuration field is out of range; the message names the field and value."""


@attrs.frozen
class GroupSpec:
    """One KV-cache group: its attention kind and, for local kinds, the reach in tokens.

    ``window`` is the sliding window (``sliding_window``) or the attention
    chunk (``chunked_local``) in tokens, and ``None`` for ``full``.
    """

    kind: str
    window: int | None = None

    def validate(self, block_size: int, where: str) -> None:
        if self.kind not in GROUP_KINDS:
            raise ConfigError(f"{where}.kind={self.kind!r}: must be one of {', '.join(GROUP_KINDS)}")
        if self.kind == "full":
            if self.window is not None:
                raise ConfigError(f"{where}.window={self.window!r}: a full-attention group has no window")
            return
        if not isinstance(self.window, int) or isinstance(self.window, bool):
            raise ConfigError(f"{where}.window={self.window!r}: must be an integer number of tokens")
        if self.kind == "sliding_window" and self.window < 2:
            raise ConfigError(f"{where}.window={self.window}: a sliding window needs at least 2 tokens")
        if self.kind == "chunked_local" and (self.window < 1 or self.window % block_size):
            raise ConfigError(
                f"{where}.window={self.window}: an attention chunk must be a positive multiple "
                f"of block_size={block_size}"
            )

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind} if self.window is None else {"kind": self.kind, "window": self.window}


@attrs.frozen
class TargetConfig:
    """A KV cache to test: ``num_blocks`` blocks (block 0 is the null block) of
    ``block_size`` tokens shared by ``groups``, with prefix caching on or off."""

    num_blocks: int
    block_size: int
    groups: tuple[GroupSpec, ...]
    enable_caching: bool

    def validate(self) -> TargetConfig:
        for name in ("num_blocks", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (2 if name == "num_blocks" else 1):
                raise ConfigError(f"{name}={value!r}: must be an integer >= {2 if name == 'num_blocks' else 1}")
        if not isinstance(self.enable_caching, bool):
            raise ConfigError(f"enable_caching={self.enable_caching!r}: must be true or false")
        if not self.groups:
            raise ConfigError("groups=[]: at least one group is needed")
        for index, group in enumerate(self.groups):
            if not isinstance(group, GroupSpec):
                raise ConfigError(f"groups[{index}]={group!r}: must be a group spec")
            group.validate(self.block_size, f"groups[{index}]")
        return self

    def describe(self) -> str:
        kinds = ", ".join(g.kind if g.window is None else f"{g.kind}({g.window})" for g in self.groups)
        caching = "on" if self.enable_caching else "off"
        return f"{self.num_blocks} blocks x {self.block_size} tokens, caching {caching}, groups [{kinds}]"

    def to_json(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "enable_caching": self.enable_caching,
            "groups": [group.to_json() for group in self.groups],
        }
