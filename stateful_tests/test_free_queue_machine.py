"""The free-queue machine against each built-in allocator --target names (kvcore by default)."""

from __future__ import annotations

from kvcheck.targets import load_queue

from .free_queue_machine import free_queue_machine
from .run import run_machine


def test_free_queue_walks_match_a_plain_list_after_every_step(allocator: str) -> None:
    """Interleaved popleft_n / remove / append_n / prepend_n keep both walks, the count and the
    queue's self-check equal to a plain list of block ids."""
    run_machine(free_queue_machine(load_queue(allocator)))
