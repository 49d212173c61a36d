"""The record of vLLM's scheduler's calls into its allocator, read as kvcheck operations.

The methods of one ``KVCacheManager`` instance are wrapped (its class is never patched), and only the
scheduler's own calls are read, as they happen: an ``allocate_slots`` is a
:class:`~kvmodel.ops.Schedule` of that request (its hit from the ``get_computed_blocks`` before it, its
new and external tokens as passed) with what vLLM returned; a ``free`` while scheduling is a
:class:`~kvmodel.ops.Preempt`, one after the output or an abort a :class:`~kvmodel.ops.Finish`; the
first allocation of a scheduler step starts a step, the others join it.  Each operation keeps the
calls it amounts to, with their arguments, and the blocks each allocation recorded for zeroing (read
without draining the record); the scheduler's own drain is kept to be compared with them.
"""

from __future__ import annotations

import inspect
from typing import Any

import attrs

from kvcheck.targets.allocator_hooks import block_ids
from kvcheck.targets.vllm_internals import group_managers
from kvmodel.ops import Finish, GroupIds, Operation, Preempt, Schedule, StepResult


def _argument(value: object) -> object:
    """A call's argument as the record keeps it: a request by its id, blocks by their ids."""
    if hasattr(value, "request_id") and hasattr(value, "num_computed_tokens"):
        return value.request_id
    if hasattr(value, "blocks") and hasattr(value, "get_block_ids"):
        return block_ids(value.blocks)
    return value


Call = tuple[str, tuple[tuple[str, object], ...]]
"""An allocator call as the record keeps it: its name and its arguments by name."""


@attrs.frozen
class Taken:
    """What a :class:`CallRecorder` read since it was last asked: the operations, vLLM's result and
    the calls for each, what the scheduler's drain of the zeroing record returned (``None``: no drain),
    and what the allocations before it recorded, group by group."""

    ops: tuple[Operation, ...]
    results: tuple[StepResult, ...]
    calls: tuple[tuple[Call, ...], ...]
    drained: tuple[int, ...] | None
    recorded: tuple[int, ...]


class UntranslatedCall(Exception):
    """The scheduler made an allocator call that has no kvcheck operation yet."""


class CallRecorder:
    """The scheduler's calls into one vLLM ``KVCacheManager``, as operations with vLLM's results.

    Only the scheduler's own calls are read (a call the manager makes into itself is not).  The
    ``phase`` says what the engine is doing (``schedule``, ``output`` or ``abort``): a free while
    scheduling preempts, otherwise it finishes."""

    READ = ("new_step_starts", "get_computed_blocks", "allocate_slots", "free", "take_new_block_ids")
    OP_CALLS = ("get_computed_blocks", "allocate_slots", "free")
    """The calls an operation amounts to (the others start a step or drain a record)."""
    UNTRANSLATED = ("cache_blocks", "evict_blocks", "reset_prefix_cache", "pop_blocks_for_free")

    def __init__(self, manager: Any, num_groups: int) -> None:
        self.phase = "schedule"
        self._groups = group_managers(manager)
        self.recorded_for_zeroing: list[list[int]] = [[] for _ in self._groups]
        """Per group, the blocks the allocations since the last drain recorded for zeroing."""
        self.drained: tuple[int, ...] | None = None
        """What the scheduler's last drain of the zeroing record returned (``None``: no drain yet)."""
        self._drained_expected: tuple[int, ...] = ()
        self.op_calls: list[tuple[Call, ...]] = []
        """Per operation read, the calls it amounts to, with their arguments."""
        self._pending_calls: list[Call] = []
        self.raised: str | None = None
        """The call the scheduler made that raised, and what it raised (``None``: none raised)."""
        self._no_hit: tuple[GroupIds, int] = tuple(() for _ in range(num_groups)), 0
        self.ops: list[Operation] = []
        self.results: list[StepResult] = []
        self._hits: dict[str, tuple[GroupIds, int]] = {}
        self._joins_step = False
        self._depth = 0
        for name in (*self.READ, *self.UNTRANSLATED):
            self._wrap(manager, name)

    def take(self) -> Taken:
        """What was read since the last take."""
        taken = Taken(tuple(self.ops), tuple(self.results), tuple(self.op_calls), self.drained, self._drained_expected)
        self.ops.clear()
        self.results.clear()
        self.op_calls.clear()
        self.drained, self._drained_expected = None, ()
        return taken

    def _read_op(self, op: Operation, result: StepResult) -> None:
        """An operation read, with vLLM's result and the calls since the last one."""
        self.ops.append(op)
        self.results.append(result)
        self.op_calls.append(tuple(self._pending_calls))
        self._pending_calls.clear()

    def add(self, op: Operation) -> None:
        """An operation the engine performs itself (a request's arrival)."""
        self._read_op(op, StepResult())

    def _wrap(self, manager: Any, name: str) -> None:
        call = getattr(manager, name)
        # The class's signature names every argument, whatever a planted fault wrapped the instance's with.
        signature = inspect.signature(getattr(type(manager), name))
        read = getattr(self, f"_read_{name}", None)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return call(*args, **kwargs)
            if read is None:
                raise UntranslatedCall(f"{name} while the engine does {self.phase}: no kvcheck operation reads it yet")
            bound = signature.bind(manager, *args, **kwargs)
            bound.apply_defaults()
            before = read(None, bound.arguments, None)
            self._depth += 1
            try:
                result = call(*args, **kwargs)
            except Exception as exc:
                request = bound.arguments.get("request")
                who = f"({request.request_id})" if request is not None else "()"
                self.raised = f"{name}{who} raised {type(exc).__name__}: {exc}"
                raise
            finally:
                self._depth -= 1
            if name in self.OP_CALLS:
                arguments = tuple((key, _argument(value)) for key, value in bound.arguments.items() if key != "self")
                self._pending_calls.append((name, arguments))
            read(before, bound.arguments, result)
            return result

        setattr(manager, name, recorded)

    # Each reader is called twice: before the call (``before`` is None; it returns what it needs to
    # remember of the request, which the call changes) and after it, with that and the result.

    def _read_new_step_starts(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        self._joins_step = False

    def _read_get_computed_blocks(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        if result is not None:
            blocks, hit_length = result[0], result[1]
            self._hits[arguments["request"].request_id] = block_ids(blocks.blocks), hit_length

    def _read_allocate_slots(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        request = arguments["request"]
        if before is None:
            return request.status.name, request.num_computed_tokens, [len(m.new_block_ids) for m in self._groups]
        status, computed, recorded_before = before
        # The blocks this call recorded for zeroing, group by group, read without draining the record.
        zeroed = [m.new_block_ids[start:] for m, start in zip(self._groups, recorded_before, strict=True)]
        for group, ids in zip(self.recorded_for_zeroing, zeroed, strict=True):
            group.extend(ids)
        if arguments["delay_cache_blocks"]:
            raise UntranslatedCall("allocate_slots with delay_cache_blocks: no connector is driven yet")
        waiting = status != "RUNNING"
        rid = request.request_id
        hit_ids, hit_length = self._hits.pop(rid, self._no_hit) if waiting else self._no_hit
        external = arguments["num_external_computed_tokens"]
        new_tokens = arguments["num_new_tokens"]
        op = Schedule(rid, new_tokens, num_external_tokens=external if waiting else 0, same_step=self._joins_step)
        self._joins_step = True
        admitted = result is not None
        slots = computed + hit_length + external + new_tokens + arguments["num_lookahead_tokens"]
        self._read_op(
            op,
            StepResult(
                admitted=admitted,
                hit_length=hit_length if waiting else None,
                hit_block_ids=hit_ids if waiting else None,
                new_block_ids=block_ids(result.blocks) if admitted else None,
                num_external_tokens=external if admitted and waiting else 0,
                num_slots=slots if admitted else None,
                zeroed_block_ids=tuple(block for ids in zeroed for block in ids),
            ),
        )
        return None

    def _read_take_new_block_ids(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        if before is None:
            return True
        self.drained = tuple(result)
        self._drained_expected = tuple(block for ids in self.recorded_for_zeroing for block in ids)
        self.recorded_for_zeroing = [[] for _ in self._groups]
        return None

    def _read_free(self, before: Any, arguments: dict[str, Any], result: Any) -> Any:
        if before is None:
            return True
        rid = arguments["request"].request_id
        self._hits.pop(rid, None)
        self._read_op(Preempt(rid) if self.phase == "schedule" else Finish(rid), StepResult())
        return None
