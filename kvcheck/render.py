"""Rendering a replay step by step, for a person: queue, ref counts, tables, cache, deferred frees and
steps in flight, changes marked."""

from __future__ import annotations

from collections.abc import Iterable

from kvcheck.replay import Replay
from kvmodel.invariants import InvariantViolation
from kvmodel.observation import Observation
from kvmodel.ops import describe_op

CHANGED = "*"


def _prefix(prefix: tuple[int, ...]) -> str:
    return "".join(str(t) if t < 10 else f"<{t}>" for t in prefix) or "-"


def _lines(obs: Observation) -> dict[str, str]:
    """One line per cell of the state, keyed by a stable cell name."""
    cells = {"free queue (head first)": str(list(obs.free_order))}
    held = {b: n for b, n in sorted(obs.ref_counts.items()) if n}
    cells["ref counts (held blocks)"] = ", ".join(f"{b}:{n}" for b, n in held.items()) or "none"
    for request_id, groups in sorted(obs.tables.items()):
        for group_id, table in enumerate(groups):
            cells[f"table {request_id} group {group_id}"] = str(list(table))
    for group_id, prefix, block_id in sorted(obs.cache_entries, key=lambda e: (e[0], len(e[1]), e[1], e[2])):
        cells[f"cache g{group_id} {_prefix(prefix)}"] = f"block {block_id}"
    for index, popped in enumerate(obs.deferred_frees):
        cells[f"deferred free {index}"] = f"holds {list(popped)}"
    for index, (request_id, reads) in enumerate(obs.in_flight_reads):
        cells[f"in flight {index}"] = f"{request_id} reads {list(map(list, reads))}"
    return cells


def render(replay: Replay, title: str, color: bool = False) -> Iterable[str]:
    """Lines showing the target's state after every step; changed cells marked with ``*``."""
    bold, red, reset = ("\033[1m", "\033[31m", "\033[0m") if color else ("", "", "")
    yield f"{bold}{title}{reset}"
    previous: dict[str, str] = {}
    for check in replay.checks:
        yield ""
        yield f"{bold}step {check.step}: {describe_op(check.op)}{reset}"
        result = check.sut_result
        if result.admitted is not None:
            outcome = "admitted" if result.admitted else "refused (allocate_slots returned None)"
            hit = (
                f", hit {result.hit_length} tokens {list(map(list, result.hit_block_ids or ()))}"
                if result.hit_length
                else ""
            )
            ext = f", {result.num_external_tokens} external tokens" if result.num_external_tokens else ""
            new = f", new blocks {list(map(list, result.new_block_ids))}" if result.new_block_ids else ""
            yield f"  -> {outcome}{hit}{ext}{new}"
        if result.reset_done is not None:
            yield f"  -> reset {'done' if result.reset_done else 'refused (blocks held)'}"
        cells = _lines(check.sut)
        width = max(len(name) for name in cells)
        for name, value in cells.items():
            mark = CHANGED if previous.get(name) != value else " "
            yield f"  {mark} {name:<{width}}  {value}"
        for name in sorted(previous.keys() - cells.keys()):
            yield f"  {CHANGED} {name:<{width}}  (gone)"
        previous = cells
    if replay.violation is not None:
        yield ""
        for line in _violation_lines(replay.violation):
            yield f"{red}{line}{reset}"
    else:
        yield ""
        yield f"every invariant held after each of {replay.steps_run} steps"


def _violation_lines(violation: InvariantViolation) -> list[str]:
    return ["!! " + line for line in str(violation).splitlines()]
