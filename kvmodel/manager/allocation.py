"""``allocate_slots`` and freeing: admission, how each group's table grows, the blocks released as they
leave every window, block copies, and frees deferred behind steps in flight."""

from __future__ import annotations

from kvmodel.group_spec import GroupSpec
from kvmodel.kinds.base import ceil_div
from kvmodel.manager.aligned_states import AlignedStates
from kvmodel.manager.state import skipped_tokens
from kvmodel.ops import GroupIds
from kvmodel.pool_model import NULL


class Allocation(AlignedStates):
    """Giving a request's tables the blocks a step needs, and taking them back."""

    def _allocate(
        self,
        rid: str,
        waiting: bool,
        hit_ids: GroupIds,
        total_computed: int,
        external: int,
        slots: int,
        main_model_tokens: int | None = None,
        load_lands_later: bool = False,
    ) -> GroupIds | None:
        """``allocate_slots``: the request's table grows to ``slots`` token positions (an align-mode
        Mamba group's to ``main_model_tokens``, the slots without a drafter's lookahead), a waiting
        request first taking its hit and ``external`` loaded tokens (not zeroed where
        ``load_lands_later`` writes them); the new blocks, or ``None`` when refused."""
        main = slots if main_model_tokens is None else main_model_tokens
        request = self.requests[rid]
        num_groups = len(self.groups)
        config = self.config
        # A waiting request (new or preempted) is admitted with the scheduler's
        # gates: the watermark while another request runs, the reserved blocks,
        # and, asked for, room for the whole request.
        watermark = reserved = 0
        if request.waiting:
            others_run = any(m.running for r, m in self.requests.items() if r != rid)
            watermark = int(config.watermark * config.num_blocks) if others_run else 0
            reserved = config.reserved_blocks
            if config.reserve_full_sequence:
                whole = self._blocks_needed(
                    rid, waiting, hit_ids, total_computed, external, len(request.tokens), cap=True
                )
                if whole + watermark > len(self.pool.free_order):
                    return None
        # Blocks that left every future token's window are released whether
        # or not the step is admitted; tokens of steps in flight do not count.
        for group_id in range(num_groups):
            self._release_skipped(rid, group_id, max(0, total_computed - request.num_in_flight_tokens))

        # Admission: the step fits when the free queue holds every block it
        # takes: new blocks for the tables, plus hit blocks now sitting free.
        taken = self._blocks_needed(rid, waiting, hit_ids, total_computed, external, slots, cap=False, main=main)
        self._plan_checkpoints(rid, waiting, hit_ids, total_computed, main)
        if taken + watermark > len(self.pool.free_order) - reserved:
            return None

        # Every group takes its local hit before any group allocates for
        # external tokens.
        if waiting and (any(hit_ids) or external > 0):
            for group_id, group in enumerate(self.groups):
                if not group.rules.in_prefix_cache:
                    continue
                num_skipped = skipped_tokens(group, total_computed) // self.block_sizes[group_id]
                kept_hits = list(hit_ids[group_id][num_skipped:])
                self.pool.touch(kept_hits)
                table = self.table(rid, group_id)
                table.extend([NULL] * num_skipped + kept_hits)
                self.num_cached[(rid, group_id)] = len(table)
                block_size = self.block_sizes[group_id]
                if self._hit_ends_inside_block(kept_hits, total_computed - external, block_size):
                    # The shared block is copied to one of the request's own before it writes there.
                    position = total_computed // block_size
                    self.copy_pending[(rid, group_id)] = (position, kept_hits[-1])
                    self.num_cached[(rid, group_id)] = position
            for group_id, group in enumerate(self.groups):
                if external > 0 and (
                    group.rules.scratch_block
                    or (not group.rules.encoder_blocks and total_computed - skipped_tokens(group, total_computed) > 0)
                ):
                    zero = not (load_lands_later and group_id in self.config.async_loaded_group_ids)
                    self._grow(rid, group_id, total_computed, loaded=True, zero=zero)
        return tuple(
            tuple(self._grow(rid, group_id, main if group.rules.aligned_states else slots))
            for group_id, group in enumerate(self.groups)
        )

    def _blocks_needed(
        self,
        rid: str,
        waiting: bool,
        hit_ids: GroupIds,
        total_computed: int,
        external: int,
        num_tokens: int,
        cap: bool,
        main: int | None = None,
    ) -> int:
        """Free blocks the request takes to have ``num_tokens`` slots (``main`` of them the main
        model's; ``external`` of its ``total_computed`` tokens loaded): new blocks for the tables, plus
        hit blocks now sitting free.  With ``cap``, a group that frees blocks as it goes counts at most
        what a request holds at once with ``max_in_flight_tokens`` tokens in flight.  An align-mode
        Mamba group counts one new block when the main model's slots reach past its table (hit
        included), and the shortfall (as a negative count, vLLM 0.33.0 sums it) when its table reaches
        past them.  Changes nothing (:meth:`_plan_checkpoints` records the checkpoints it counts)."""
        taken = 0
        for group_id, group in enumerate(self.groups):
            block_size = self.block_sizes[group_id]
            copies = waiting and self._hit_ends_inside_block(hit_ids[group_id], total_computed - external, block_size)
            table = self.pool.holders.get((rid, group_id), [])
            if group.rules.aligned_states:
                hit = hit_ids[group_id] if waiting else ()
                if self._state_cached_this_step(hit):
                    # The state is computed by this step: the request waits for the next (vLLM asks for
                    # more blocks than the pool has).
                    taken += self.config.num_blocks + 1
                    continue
                taken += sum(1 for b in hit if b in self.pool.free_order)
                end = num_tokens if main is None else main
                wanted = self._slot_blocks(rid, group_id, end)
                most = 1 if (rid, group_id) in self.mamba_allocated else 1 + group.speculative_blocks
                copies = copies or (rid, group_id) in self.copy_pending
                num_new = wanted - len(hit) - len(table)
                if copies:
                    num_new = max(num_new, 0) + 1
                checkpoint = self._planned_checkpoint(rid, group_id, total_computed, end)
                taken += min(num_new, most + copies + (checkpoint > 0))
                continue
            if not group.rules.in_prefix_cache:
                taken += max(0, self._slot_blocks(rid, group_id, num_tokens) - len(table))
                continue
            required = self._slot_blocks(rid, group_id, num_tokens)
            limit = self._admission_cap(group, self.config.spec_block_size(group_id)) if cap else None
            if limit is not None:
                required = min(required, limit)
            length_before_growth = len(table)
            if waiting:
                num_skipped = skipped_tokens(group, total_computed) // block_size
                kept_hits = hit_ids[group_id][num_skipped:]
                taken += sum(1 for b in kept_hits if b in self.pool.free_order)
                length_before_growth = max(num_skipped, len(hit_ids[group_id]))
            taken += max(0, required - length_before_growth) + copies
        return taken

    def _admission_cap(self, group: GroupSpec, block_size: int) -> int | None:
        """Blocks a request of ``group`` holds at once with the configured tokens in flight (``None``:
        no cap): a window's last ``W - 1`` tokens, or a chunk, plus the tokens in flight (a window one
        block more, as it may start inside a block), in blocks of ``block_size`` tokens: the group's
        size on one rank, as vLLM 0.33.0 counts them under decode context parallelism."""
        in_flight = self.config.max_in_flight_tokens
        if in_flight is None:
            return None
        return group.rules.admission_cap(group, in_flight, block_size)

    def _grow(self, rid: str, group_id: int, num_tokens: int, loaded: bool = False, zero: bool = True) -> list[int]:
        """Grow the table to give ``num_tokens`` slots; ``loaded``: blocks for tokens an external
        connector loads, which take a block per ``block_size`` tokens in every kind but a ring.  The
        blocks taken are recorded for zeroing in a zeroed group, unless not ``zero``."""
        table = self.table(rid, group_id)
        wanted = (
            ceil_div(num_tokens, self.block_sizes[group_id])
            if loaded and not self.groups[group_id].rules.scratch_block
            else self._slot_blocks(rid, group_id, num_tokens)
        )
        if self.groups[group_id].rules.aligned_states and not loaded:
            return self._grow_states(rid, group_id, wanted)
        copied = []
        pending = None if loaded else self.copy_pending.pop((rid, group_id), None)
        if pending is not None:
            position, source = pending
            copied = self.pool.take_free(1)
            table[position] = copied[0]
            self.step_copies.append((source, copied[0]))
        added = self.pool.take_free(max(0, wanted - len(table)))
        table.extend(added)
        if zero and group_id in self.zeroed_groups:
            self.to_zero.setdefault(group_id, []).extend(copied + added)
        return copied + added

    def _release_skipped(self, rid: str, group_id: int, total_computed: int) -> None:
        table = self.pool.holders.get((rid, group_id))
        if not table:
            return
        group = self.groups[group_id]
        released_range = group.released_blocks(
            total_computed, self.requests[rid].num_prompt_tokens, self.block_sizes[group_id]
        )
        end = min(released_range.stop, len(table))
        released: list[int] = []
        for position in range(end - 1, released_range.start - 1, -1):
            if table[position] == NULL:
                if group.rules.aligned_states:
                    continue  # an align-mode Mamba table has null gaps between states: all are freed
                break
            released.append(table[position])
            table[position] = NULL
        self.pool.release(released)

    def _release_copies(self) -> tuple[tuple[int, int], ...]:
        """The step's block copies; their endpoints (each copy's source, then its destination) are
        released once the copies have run: at once, or with deferred frees once the step is processed."""
        copies, self.step_copies = tuple(self.step_copies), []
        endpoints = [block for copy in copies for block in copy]
        if endpoints and self.pipeline.defer_block_free:
            # Deferred frees are released last block first: the endpoints are kept reversed.
            self._defer_free(endpoints[::-1])
        elif endpoints:
            self.pool.release(endpoints)
        return copies

    def _defer_free(self, blocks: list[int]) -> None:
        """Hold ``blocks`` until every step scheduled so far is processed, then free them last first."""
        key = ("deferred", self._num_deferred)
        self._num_deferred += 1
        self.pool.holders[key] = blocks
        self.pipeline.defer_free(key)

    def _release(self, rid: str, finished: bool) -> None:
        """Free the request, or (a step of it in flight, frees deferred) hold its blocks until that
        step is processed: group 0's table first, each without its leading null blocks."""
        if self.pipeline.must_defer_free(rid):
            popped: list[int] = []
            for group_id in range(len(self.groups)):
                table = self.pool.holders.pop((rid, group_id), [])
                self.num_cached.pop((rid, group_id), None)
                self.mamba_allocated.discard((rid, group_id))
                self.checkpoints.pop((rid, group_id), None)
                self.copy_pending.pop((rid, group_id), None)
                self.producer_tails.pop((rid, group_id), None)
                start = next((i for i, b in enumerate(table) if b != NULL), len(table))
                popped.extend(table[start:])
            if popped:
                self._defer_free(popped)
        else:
            self._free(rid)
        self.pipeline.freed(self.requests[rid], finished)

    def _free(self, rid: str) -> None:
        for group_id in range(len(self.groups)):
            table = self.pool.holders.pop((rid, group_id), [])
            self.num_cached.pop((rid, group_id), None)
            self.mamba_allocated.discard((rid, group_id))
            self.checkpoints.pop((rid, group_id), None)
            self.copy_pending.pop((rid, group_id), None)
            self.producer_tails.pop((rid, group_id), None)
            self.pool.release(reversed(table))
