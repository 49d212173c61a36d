"""The scopes ``kvcheck explore`` enumerates: configurations and operation sizes, as plain data.

Kept apart from the explorer itself so that the command line can name the
layouts, features and scopes without importing the model.
"""

from __future__ import annotations

import itertools

import attrs

from kvcheck.kinds import HarnessKind
from kvcheck.kinds.chunked_local import CHUNKED_LOCAL
from kvcheck.kinds.full import FULL
from kvcheck.kinds.sliding_window import SLIDING_WINDOW
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec

LAYOUTS: dict[str, tuple[HarnessKind, ...]] = {
    "full": (FULL,),
    "window": (SLIDING_WINDOW,),
    "chunked": (CHUNKED_LOCAL,),
    "full+window": (FULL, SLIDING_WINDOW),
    "full+chunked": (FULL, CHUNKED_LOCAL),
}
"""Group layouts by name; a scope's ``reach`` sizes the local groups' windows and chunks."""

FEATURES = ("plain", "eagle", "lookahead", "spec", "hash-lookahead", "prefill-lookahead", "async", "deferred")
"""Drafter and async variants a scope can add to each layout (those a layout cannot take are left out):
plain; an EAGLE drafter; one lookahead slot per step; speculative steps (a drafter's 2 tokens); hashes
looking 1 token ahead; a prefill lookahead of 2; async scheduling; async with deferred frees."""


@attrs.frozen
class Scope:
    """What the explorer enumerates."""

    num_blocks: int
    block_sizes: tuple[int, ...]
    layouts: tuple[str, ...]
    caching: tuple[bool, ...]
    features: tuple[str, ...]
    depth: int
    alphabet: int = 2
    prompt_lengths: tuple[int, ...] = (1, 2, 3)
    max_requests: int = 2
    schedule_sizes: tuple[int, ...] = (1, 2)
    external_tokens: tuple[int, ...] = (0, 1)
    reach: int = 2
    """Blocks a local group reaches: a window of ``reach * block_size`` tokens, or a chunk of ``reach`` blocks."""

    def configs(self) -> list[tuple[TargetConfig, str]]:
        """Every configuration of the scope with the feature it was built for."""
        configs = []
        for block_size, layout, caching, feature in itertools.product(
            self.block_sizes, self.layouts, self.caching, self.features
        ):
            groups = tuple(_group(kind, block_size, self.reach) for kind in LAYOUTS[layout])
            config = _with_feature(
                TargetConfig(num_blocks=self.num_blocks, block_size=block_size, groups=groups, enable_caching=caching),
                feature,
            )
            if config is not None:
                configs.append((config, feature))
        return configs

    def describe(self) -> str:
        return (
            f"{self.num_blocks - 1} usable blocks, block sizes {list(self.block_sizes)}, layouts "
            f"{list(self.layouts)}, caching {['on' if c else 'off' for c in self.caching]}, features "
            f"{list(self.features)}, alphabet {self.alphabet}, prompts of {list(self.prompt_lengths)} tokens, "
            f"<= {self.max_requests} requests, schedule sizes {list(self.schedule_sizes)}, external tokens "
            f"{list(self.external_tokens)}, local groups reaching {self.reach} blocks, depth {self.depth}"
        )


SCOPES = {
    "ci": Scope(5, (1,), ("full", "full+window"), (True, False), ("plain",), depth=4),
    "standard": Scope(5, (1, 2), tuple(LAYOUTS), (True, False), FEATURES, depth=4),
}
"""Named scopes: ``ci`` runs in the default tests (seconds); ``standard`` is the documented larger one."""


def _group(kind: HarnessKind, block_size: int, reach: int) -> GroupSpec:
    return kind.group(window=reach * block_size) if kind.model.has_window else kind.group()


def _with_feature(config: TargetConfig, feature: str) -> TargetConfig | None:
    """``config`` with the feature on, or ``None`` when the configuration cannot take it."""
    chunked = any(group.rules.chunked for group in config.groups)
    if feature == "plain":
        return config
    if feature == "eagle":
        return attrs.evolve(config, use_eagle=True) if config.enable_caching and not chunked else None
    if feature == "lookahead":
        return attrs.evolve(config, num_lookahead_tokens=1)
    if feature == "spec":
        return attrs.evolve(config, num_lookahead_tokens=2)
    if feature == "hash-lookahead":
        if not config.enable_caching:
            return None
        return attrs.evolve(config, num_hash_lookahead_tokens=1, num_prefill_lookahead=1)
    if feature == "prefill-lookahead":
        return attrs.evolve(config, num_prefill_lookahead=2) if config.block_size >= 2 else None
    if feature == "async":
        return attrs.evolve(config, async_scheduling=True)
    if feature == "deferred":
        return attrs.evolve(config, async_scheduling=True, defer_block_free=True)
    raise ValueError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
