"""The free-queue machine: a free-block queue against a plain list of block ids.

Blocks ``1..N`` start in the queue in id order.  A block taken out (popped
or removed) is *out* and may be put back at either end, as part of a list of
distinct out blocks.  After every step both walks of the queue, its count
and its own self-check must agree with the list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule


class QueueTarget(Protocol):
    """A free-block queue whose blocks are named by id (see :mod:`kvcheck.targets.kvcore_queue`)."""

    @property
    def num_free(self) -> int: ...
    def popleft_n(self, n: int) -> list[int] | None: ...
    def remove(self, block_id: int) -> None: ...
    def append_n(self, block_ids: Sequence[int]) -> None: ...
    def prepend_n(self, block_ids: Sequence[int]) -> None: ...
    def ids(self) -> list[int]: ...
    def ids_from_tail(self) -> list[int]: ...
    def check_internal(self) -> None: ...


QueueFactory = Callable[[int], QueueTarget]
"""Builds a queue holding blocks ``1..num_blocks`` in id order."""

MAX_BLOCKS = 24


def distinct_ids(pool: Sequence[int]) -> st.SearchStrategy[list[int]]:
    """Lists of distinct ids from ``pool``, in any order (empty when the pool is)."""
    if not pool:
        return st.just([])
    return st.lists(st.sampled_from(sorted(pool)), unique=True, max_size=len(pool))


def free_queue_machine(make_queue: QueueFactory) -> type[RuleBasedStateMachine]:
    """A state machine class driving the queue ``make_queue`` builds against a list."""

    class FreeQueueMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.queue: QueueTarget
            self.model: list[int] = []
            self.out: set[int] = set()
            self.step = 0

        def _note(self, what: str) -> None:
            self.step += 1
            note(f"step {self.step}: {what} -> model={self.model}")

        @initialize(num_blocks=st.integers(1, MAX_BLOCKS))
        def configure(self, num_blocks: int) -> None:
            self.queue = make_queue(num_blocks)
            self.model = list(range(1, num_blocks + 1))
            note(f"config: blocks 1..{num_blocks} in the queue")

        @rule(data=st.data())
        def popleft_n(self, data: st.DataObject) -> None:
            n = data.draw(st.integers(0, len(self.model)), label="n")
            taken = self.queue.popleft_n(n)
            expected, self.model = self.model[:n], self.model[n:]
            self.out.update(expected)
            self._note(f"popleft_n({n}) = {taken}")
            assert taken == expected, f"step {self.step}: popleft_n({n}) diverged: sut={taken} model={expected}"

        @rule(extra=st.integers(1, 3))
        def popleft_n_beyond_free(self, extra: int) -> None:
            n = len(self.model) + extra
            taken = self.queue.popleft_n(n)
            self._note(f"popleft_n({n}) with {len(self.model)} free = {taken}")
            assert taken is None, f"step {self.step}: popleft_n({n}) was not refused: sut={taken} model=None"

        @precondition(lambda self: bool(self.model))
        @rule(data=st.data())
        def remove(self, data: st.DataObject) -> None:
            block_id = data.draw(st.sampled_from(self.model), label="block_id")
            self.queue.remove(block_id)
            self.model.remove(block_id)
            self.out.add(block_id)
            self._note(f"remove({block_id})")

        @rule(data=st.data())
        def append_n(self, data: st.DataObject) -> None:
            block_ids = data.draw(distinct_ids(sorted(self.out)), label="block_ids")
            self.queue.append_n(block_ids)
            self.model = self.model + block_ids
            self.out.difference_update(block_ids)
            self._note(f"append_n({block_ids})")

        @rule(data=st.data())
        def prepend_n(self, data: st.DataObject) -> None:
            block_ids = data.draw(distinct_ids(sorted(self.out)), label="block_ids")
            self.queue.prepend_n(block_ids)
            self.model = block_ids + self.model
            self.out.difference_update(block_ids)
            self._note(f"prepend_n({block_ids})")

        @invariant()
        def walks_match_model(self) -> None:
            forward = self.queue.ids()
            assert forward == self.model, f"step {self.step}: forward walk diverged: sut={forward} model={self.model}"
            backward, expected = self.queue.ids_from_tail(), self.model[::-1]
            assert backward == expected, f"step {self.step}: backward walk diverged: sut={backward} model={expected}"

        @invariant()
        def num_free_matches_model(self) -> None:
            sut = self.queue.num_free
            assert sut == len(self.model), f"step {self.step}: num_free diverged: sut={sut} model={len(self.model)}"

        @invariant()
        def queue_self_check_passes(self) -> None:
            try:
                self.queue.check_internal()
            except AssertionError as exc:
                raise AssertionError(
                    f"step {self.step}: queue self-check failed: {exc}: sut={self.queue.ids()} model={self.model}"
                ) from exc

    return FreeQueueMachine
