"""A scheduler-driven target's side of its steps in flight (the steps themselves are
:mod:`kvcheck.targets.pipeline`'s).

Under async scheduling a step is scheduled before the previous one's output is processed: the target
hands the pipeline the blocks each step reads and writes, releases a step's block copies at once or
behind a deferred free, and processes the oldest output (its sampled token appended, its blocks
cached).
"""

from __future__ import annotations

from typing import Any

from kvcheck.targets.pipeline import GroupPositions, read_positions
from kvcheck.targets.scheduler_state import SchedulerState
from kvmodel.ops import GroupIds


class InFlightSteps(SchedulerState):
    """Block reads, block copies and outputs of the steps in flight."""

    def _release_copies(self) -> tuple[tuple[int, int], ...]:
        """Take the step's block copies and release their endpoints as vLLM's scheduler does once the
        step is scheduled: at once, or with deferred frees once the step is processed (a deferred free
        is released last block first, so the endpoints go in reversed)."""
        copies, retained = self._take_block_copies()
        if retained:
            if self.pipeline.defer_block_free:
                self.pipeline.defer_free(self._deferred_retained(retained))
            else:
                self._free_retained(retained)
        return tuple(copies)

    def _deferred_retained(self, blocks: list[Any]) -> list[Any]:
        """The endpoints of copies as a deferred free holds them: reversed, as it frees last block first."""
        return blocks[::-1]

    def _process_output(self) -> None:
        """Process the oldest step in flight's output."""

        def append(request: Any, token: int) -> None:
            request.append_output_token_ids(token)
            self._learn_hashes(request.request_id)

        self.pipeline.process_next(
            self.requests.get, self.running.__contains__, append, self._cache_blocks, self._free_popped
        )

    def _read_positions(self, request: Any, num_computed_tokens: int, num_new_tokens: int) -> GroupPositions:
        """The block positions, per group, that a step of ``request`` reads and writes."""
        config = self.config
        return read_positions(
            config.groups,
            self._block_sizes,
            num_computed_tokens,
            num_new_tokens,
            request.num_prompt_tokens,
            config.num_encoder_tokens,
            self._state_tokens.get(request.request_id),
        )

    def _reads(self, request: Any, num_computed_tokens: int, num_new_tokens: int) -> GroupIds:
        """Block ids at the positions a step reads and writes, per group (0 where the table has none)."""
        if not self.config.async_scheduling:
            return ()
        table = self._table(request.request_id)
        positions = self._read_positions(request, num_computed_tokens, num_new_tokens)
        return tuple(
            tuple(blocks[p] if p < len(blocks) else 0 for p in group_positions)
            for blocks, group_positions in zip(table, positions)
        )
