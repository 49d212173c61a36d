"""The block-pool machine: a block pool against :class:`kvmodel.pool_model.PoolModel`.

Holders stand for request tables: each holds the blocks it allocated or hit,
in table order, and frees them tail first.  Cache keys are small ints that
stand for token prefixes (``(group, (key,))`` in the model).  After every
step the free order (both walks), the reference counts, the cache entries and
the pool's own self-check must agree with the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, precondition, rule

from kvmodel.pool_model import CacheKey, PoolModel

PoolEntry = tuple[int, int, int]
"""A prefix-cache entry as (group id, key, block id)."""


class PoolTarget(Protocol):
    """A block pool named by block ids and int keys (see :mod:`kvcheck.targets.kvcore_pool`)."""

    moves_cached_blocks: bool
    """Whether ``cache`` accepts blocks cached already, moving them to the new key (kvcore does;
    vLLM re-enters a cached block only when a partial block becomes full)."""

    @property
    def num_free(self) -> int: ...
    def get_new_blocks(self, n_blocks: int) -> list[int] | None: ...
    def touch(self, block_ids: Sequence[int]) -> None: ...
    def free(self, block_ids_in_eviction_order: Sequence[int]) -> None: ...
    def cache(self, block_ids: Sequence[int], keys: Sequence[int], group_id: int) -> None: ...
    def lookup(self, key: int, group_id: int) -> int | None: ...
    def evict(self, block_ids: Sequence[int]) -> None: ...
    def reset(self) -> bool: ...
    def free_order(self) -> list[int]: ...
    def free_order_from_tail(self) -> list[int]: ...
    def ref_counts(self) -> dict[int, int]: ...
    def cache_entries(self) -> frozenset[PoolEntry]: ...
    def check_internal(self) -> None: ...


PoolFactory = Callable[[int, bool], PoolTarget]
"""Builds a pool of ``num_blocks`` blocks (block 0 the null block) with caching on or off."""

NUM_GROUPS = 2
MAX_TOUCHED_KEYS = 4


def model_key(key: int, group_id: int) -> CacheKey:
    """The model's cache key for an int key: the one-token prefix ``(key,)`` in ``group_id``."""
    return group_id, (key,)


def model_entries(model: PoolModel) -> frozenset[PoolEntry]:
    return frozenset((group_id, prefix[0], block_id) for block_id, (group_id, prefix) in model.cache.items())


def block_pool_machine(make_pool: PoolFactory) -> type[RuleBasedStateMachine]:
    """A state machine class driving the pool ``make_pool`` builds and the pool model in lockstep."""

    class BlockPoolMachine(RuleBasedStateMachine):
        holders = Bundle("holders")

        def __init__(self) -> None:
            super().__init__()
            self.pool: PoolTarget
            self.model: PoolModel
            self.step = 0
            self.next_holder = 0
            self.next_key = 0

        def _note(self, what: str) -> None:
            self.step += 1
            note(f"step {self.step}: {what}")

        def _new_holder(self, block_ids: list[int]) -> str:
            name = f"h{self.next_holder}"
            self.next_holder += 1
            self.model.holders[name] = block_ids
            return name

        def _fresh_key(self) -> int:
            self.next_key += 1
            return self.next_key - 1

        @initialize(num_blocks=st.integers(2, 32), enable_caching=st.booleans())
        def configure(self, num_blocks: int, enable_caching: bool) -> None:
            self.pool = make_pool(num_blocks, enable_caching)
            self.model = PoolModel(num_blocks, enable_caching)
            note(f"config: num_blocks={num_blocks} enable_caching={enable_caching}")

        @precondition(lambda self: bool(self.model.free_order))
        @rule(target=holders, data=st.data())
        def allocate(self, data: st.DataObject) -> str:
            n_blocks = data.draw(st.integers(1, len(self.model.free_order)), label="n_blocks")
            got = self.pool.get_new_blocks(n_blocks)
            expected = self.model.take_free(n_blocks)
            name = self._new_holder(expected)
            self._note(f"allocate {name} {n_blocks=} -> {got}")
            assert got == expected, f"step {self.step}: allocated ids diverged: sut={got} model={expected}"
            return name

        @precondition(lambda self: bool(self.model.holders))
        @rule(extra=st.integers(1, 3))
        def allocate_beyond_free(self, extra: int) -> None:
            """Ask for more blocks than are free while some are held: refused, and nothing changes."""
            n_blocks = len(self.model.free_order) + extra
            got = self.pool.get_new_blocks(n_blocks)
            self._note(f"allocate {n_blocks=} with {len(self.model.free_order)} free -> {got}")
            assert got is None, f"step {self.step}: over-allocation was not refused: sut={got} model=None"

        @precondition(lambda self: bool(self.model.cache))
        @rule(target=holders, data=st.data())
        def touch(self, data: st.DataObject) -> str:
            """A new holder hits some cached keys: it takes a reference on the block each key finds."""
            cached_keys = sorted({(prefix[0], group_id) for group_id, prefix in self.model.cache.values()})
            keys = data.draw(
                st.lists(st.sampled_from(cached_keys), min_size=1, max_size=MAX_TOUCHED_KEYS, unique=True),
                label="keys",
            )
            found = [self.pool.lookup(key, group_id) for key, group_id in keys]
            expected = [self.model.lookup(model_key(key, group_id)) for key, group_id in keys]
            assert found == expected, f"step {self.step + 1}: lookup of {keys} diverged: sut={found} model={expected}"
            block_ids = [block_id for block_id in expected if block_id is not None]
            self.pool.touch(block_ids)
            self.model.touch(block_ids)
            name = self._new_holder(block_ids)
            self._note(f"touch {name} keys={keys} -> {block_ids}")
            return name

        # With caching off no manager caches a block, so the machine does not either: vLLM's
        # pool would then keep a reused block's cache entry, outside any caller's contract.
        @precondition(lambda self: self.model.enable_caching)
        @rule(holder=holders, group_id=st.integers(0, NUM_GROUPS - 1), rekey=st.booleans(), data=st.data())
        def cache(self, holder: str, group_id: int, rekey: bool, data: st.DataObject) -> None:
            """Enter a holder's uncached blocks (with ``rekey``, where the pool moves cached blocks, all
            its blocks) under fresh keys; a key may instead be shared with a block already cached, as
            blocks are not de-duplicated."""
            held = self.model.holders[holder]
            block_ids = (
                list(held)
                if rekey and self.pool.moves_cached_blocks
                else [block_id for block_id in held if block_id not in self.model.cache]
            )
            in_group = sorted({prefix[0] for g, prefix in self.model.cache.values() if g == group_id})
            keys = []
            for _ in block_ids:
                share = bool(in_group) and data.draw(st.booleans(), label="share a cached key")
                keys.append(data.draw(st.sampled_from(in_group), label="key") if share else self._fresh_key())
            self.pool.cache(block_ids, keys, group_id)
            for block_id, key in zip(block_ids, keys):
                self.model.cache_block(block_id, model_key(key, group_id))
            self._note(f"cache {holder} {group_id=} blocks={block_ids} keys={keys}")

        @rule(holder=consumes(holders))
        def free(self, holder: str) -> None:
            block_ids = self.model.holders.pop(holder)
            tail_first = block_ids[::-1]
            self.pool.free(tail_first)
            self.model.release(tail_first)
            self._note(f"free {holder} tail first {tail_first}")

        @precondition(lambda self: bool(self.model.cache))
        @rule(data=st.data())
        def evict(self, data: st.DataObject) -> None:
            """Drop the cache entries of some blocks, in any state: cached or not, held or free."""
            block_ids = data.draw(
                st.lists(st.integers(0, self.model.num_blocks - 1), min_size=1, max_size=4, unique=True),
                label="block_ids",
            )
            self.pool.evict(block_ids)
            self.model.evict(block_ids)
            self._note(f"evict {block_ids}")

        @precondition(lambda self: bool(self.model.cache))
        @rule()
        def reset_prefix_cache(self) -> None:
            """Empty the cache; refused while any block is held (an empty cache has nothing to show)."""
            done = self.pool.reset()
            expected = self.model.reset_prefix_cache()
            self._note(f"reset_prefix_cache -> {done}")
            assert done == expected, f"step {self.step}: reset_prefix_cache diverged: sut={done} model={expected}"

        @invariant()
        def free_order_matches_model(self) -> None:
            sut, model = self.pool.free_order(), self.model.free_order
            assert sut == model, f"step {self.step}: free order diverged: sut={sut} model={model}"
            sut, model = self.pool.free_order_from_tail(), model[::-1]
            assert sut == model, f"step {self.step}: backward free order diverged: sut={sut} model={model}"

        @invariant()
        def num_free_matches_model(self) -> None:
            sut, model = self.pool.num_free, len(self.model.free_order)
            assert sut == model, f"step {self.step}: num_free diverged: sut={sut} model={model}"

        @invariant()
        def ref_counts_match_holders(self) -> None:
            sut, model = self.pool.ref_counts(), self.model.ref_counts()
            assert sut == model, f"step {self.step}: ref counts diverged: sut={sut} model={model}"

        @invariant()
        def cache_entries_match_model(self) -> None:
            sut, model = self.pool.cache_entries(), model_entries(self.model)
            assert sut == model, (
                f"step {self.step}: cache entries (group, key, block) diverged: "
                f"sut-only={sorted(sut - model)} model-only={sorted(model - sut)}"
            )

        @invariant()
        def pool_self_check_passes(self) -> None:
            try:
                self.pool.check_internal()
            except AssertionError as exc:
                raise AssertionError(
                    f"step {self.step}: pool self-check failed: {exc}: "
                    f"sut free={self.pool.free_order()} model free={self.model.free_order}"
                ) from exc

    return BlockPoolMachine
