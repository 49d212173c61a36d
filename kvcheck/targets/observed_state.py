"""What a scheduler-driven target reports beside its allocator's own state.

The allocator's KV cache events, read as token prefixes once each step is done; the tables of the
requests holding blocks; and the observation's fields the scheduler knows of: the deferred frees and
the reads of steps in flight, the events, the prompts' lengths, the drafts given and the tokens each
request's last step ran up to.
"""

from __future__ import annotations

from typing import Any

from kvcheck.targets.scheduler_state import SchedulerState
from kvmodel.observation import CacheEvent, ClearedEvent, RemovedEvent, StoredEvent
from kvmodel.ops import GroupIds


class ObservedState(SchedulerState):
    """The scheduler's view of the target's state, for its :meth:`observe`."""

    def _record_events(self) -> None:
        """Read and keep the KV cache events the allocator queued during the step."""
        for event in self._take_events():
            self.events.extend(self._read_event(event))

    def _read_event(self, event: Any) -> list[CacheEvent]:
        """An allocator's KV cache event, its hashes read as token prefixes; ``BlockRemoved`` gives one
        event per hash.  The event classes are told apart by name, the fields read as vLLM names them."""
        kind = type(event).__name__
        prefix = self._prefix_of_event_hash.__getitem__
        if kind == "BlockStored":
            lookahead = event.lookahead_token_ids
            return [
                StoredEvent(
                    group=event.group_idx,
                    prefixes=tuple(prefix(h) for h in event.block_hashes),
                    parent=None if event.parent_block_hash is None else prefix(event.parent_block_hash),
                    token_ids=tuple(event.token_ids),
                    block_size=event.block_size,
                    lookahead_token_ids=None if lookahead is None else tuple(tuple(ids) for ids in lookahead),
                )
            ]
        if kind == "BlockRemoved":
            return [RemovedEvent(event.group_idx, prefix(h)) for h in event.block_hashes]
        if kind == "AllBlocksCleared":
            return [ClearedEvent()]
        raise TypeError(f"unknown KV cache event {event!r}")

    def pipeline_fields(self) -> dict[str, Any]:
        """The observation's view of the deferred frees and the reads of steps in flight."""
        return {
            "deferred_frees": tuple(self._popped_ids(popped) for _, popped in self.pipeline.deferred),
            "in_flight_reads": self.pipeline.held_reads(),
            "events": tuple(self.events),
            "prompt_lengths": {rid: request.num_prompt_tokens for rid, request in self.requests.items()},
            "draft_tokens": dict(self._draft_tokens),
            "state_tokens": dict(self._state_tokens),
        }

    def tables(self) -> dict[str, GroupIds]:
        """Each request holding blocks, with its table per group (0 is the null block)."""
        tables = {}
        for request_id in self._holding_request_ids():
            table = self._table(request_id)
            if any(table):
                tables[request_id] = table
        return tables
