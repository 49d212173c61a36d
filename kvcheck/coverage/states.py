"""What an operation's caching did to align-mode Mamba states, read by comparing the model before and after
it: the live states a retention interval left uncached, and the states entered at the end of a shared prefix
(shared-prefix checkpoints)."""

from __future__ import annotations

import attrs

from kvmodel.manager_model import ManagerModel
from kvmodel.observation import CacheKey
from kvmodel.pool_model import NULL

ThinnedState = tuple[str, int, int, int]
"""A live state a retention interval left uncached: (request, group, table position, block)."""


@attrs.frozen
class StateMarks:
    """The align-mode Mamba states of a model at one moment, as later caching is compared with them: the
    live states left uncached below each table's cached positions, the keys of every cached block (with
    shared-prefix checkpoints in force), and each table's count of positions its caching has passed."""

    thinned: frozenset[ThinnedState]
    keys: dict[int, frozenset[CacheKey]]
    num_cached: dict[tuple[str, int], int]

    @classmethod
    def of(cls, model: ManagerModel) -> StateMarks:
        keys = _block_keys(model) if model.config.shared_prefix_checkpoint else {}
        return cls(thinned_states(model), keys, dict(model.num_cached))


def aligned_group_ids(model: ManagerModel) -> list[int]:
    """The model's align-mode Mamba groups."""
    return [g for g, group in enumerate(model.groups) if group.rules.aligned_states]


def _block_keys(model: ManagerModel) -> dict[int, frozenset[CacheKey]]:
    """Every cached block's keys."""
    pool = model.pool
    return {block: frozenset((key, *pool.more_keys.get(block, ()))) for block, key in pool.cache.items()}


def thinned_states(model: ManagerModel) -> frozenset[ThinnedState]:
    """The live states of align-mode Mamba tables, below the positions their caching has passed, that the
    retention interval leaves uncached (none without an interval)."""
    if model.retention is None:
        return frozenset()
    found = set()
    for rid in model.requests:
        for g in aligned_group_ids(model):
            table = model.pool.holders.get((rid, g), [])
            for position in range(min(model.num_cached.get((rid, g), 0), len(table))):
                if table[position] != NULL and not model.caches_state(rid, g, position):
                    found.add((rid, g, position, table[position]))
    return frozenset(found)


def states_thinned_since(marks: StateMarks, model: ManagerModel, hit: tuple[str, int] | None = None) -> bool:
    """Whether the caching since ``marks`` left a live state uncached by the retention interval; ``hit``:
    a request that took a hit of that many tokens since, whose whole blocks of the hit were not cached
    by it."""
    new = thinned_states(model) - marks.thinned
    if hit is not None:
        rid, hit_tokens = hit
        new = frozenset(s for s in new if s[0] != rid or s[2] >= hit_tokens // model.block_sizes[s[1]])
    return bool(new)


def junction_state_cached_since(marks: StateMarks, model: ManagerModel) -> bool:
    """Whether an align-mode Mamba group entered, since ``marks``, a request's state at the end of the prefix
    its lookup found shared (a shared-prefix checkpoint), other than by caching that state as the full block
    it is, or as the request's prefill checkpoint."""
    if not model.config.shared_prefix_checkpoint:
        return False
    for rid, request in model.requests.items():
        junction = request.shared_prefix_boundary
        if not junction:
            continue
        for g in aligned_group_ids(model):
            if (rid, g) in model.checkpoints:
                continue
            block_size = model.block_sizes[g]
            position = -(-junction // block_size) - 1
            table = model.pool.holders.get((rid, g), [])
            if position >= len(table) or table[position] == NULL:
                continue
            block = table[position]
            key = (g, model.prefix_to(rid, junction))
            keys = {model.pool.cache.get(block), *model.pool.more_keys.get(block, ())}
            if key not in keys or key in marks.keys.get(block, ()):
                continue
            cached_now = marks.num_cached.get((rid, g), 0) <= position < model.num_cached.get((rid, g), 0)
            if junction % block_size == 0 and cached_now and model.caches_state(rid, g, position):
                continue
            return True
    return False
