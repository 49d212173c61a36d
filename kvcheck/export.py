"""``kvcheck export``: a trace as a standalone pytest file for vLLM, to attach to an upstream bug report.

The file imports vLLM and the Python standard library only.  It builds
vLLM's ``KVCacheManager`` for the trace's configuration, makes exactly the
calls :class:`~kvcheck.targets.vllm_target.VllmTarget` makes for each
operation (the scheduler's request-field writes between them included), and
after every step asserts the state kvcheck's reference model predicts.
Every assertion names the kvcheck invariant it stands for, the step and the
operation, with the expected (model) and actual (vLLM) values.

The operations are replayed once, on the installed vLLM, through
:class:`RecordingTarget`: a ``VllmTarget`` whose hooks write each call as a
line of Python before making it.  Objects vLLM returns that later calls
pass back get variable names; requests are wrapped in
:class:`RequestProxy`, so the scheduler layer's writes are recorded too,
but vLLM's own are not.  A plain ``VllmTarget`` runs alongside and must
return and observe the same after every step, so the recording cannot
drift from the target.  The expected values come from
:class:`~kvmodel.manager_model.ManagerModel` stepped over the same
operations, never from vLLM.

With KV cache events on (``enable_kv_cache_events``), the manager is built
with them, and the file takes ``manager.take_events()`` after each operation,
where the target takes them; its ``EventStream`` reads them as plain values,
block hashes as the token prefixes the test's requests hash to, and each step
checks the stream replayed from the start against the prefix-cache map
(``events_match_cache``) and the step's events against the ones the model's
stream adds at that step (``events_match_model``), in kvcheck's order.
Without events the file is as it was before they existed.

If kvcheck finds an invariant violated on the installed vLLM while
exporting (a real bug, the reason to export), the file stops after that
step, where the test then fails; its docstring records that verdict.
"""

from __future__ import annotations

import ast
import builtins
import enum
import inspect
import keyword
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from kvcheck.kinds import kind_of
from kvcheck.targets.vllm_internals import CACHE_ENTRIES, layout
from kvcheck.targets.vllm_target import (
    HASH_ALGORITHM,
    LAYER_LAYOUT,
    MAX_MODEL_LEN,
    VllmTarget,
    require_vllm,
)
from kvcheck.trace import Trace
from kvcheck.vllm_releases import semantics_in_force
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.invariants import InvariantViolation, StepCheck, check_all
from kvmodel.kinds import UNCACHED_KINDS
from kvmodel.manager_model import ManagerModel
from kvmodel.observation import CacheEvent, Observation, RemovedEvent, StoredEvent
from kvmodel.ops import Operation, StepResult, describe_op

LINE_LENGTH = 120
"""The exported file's line length (kvcheck's own ruff setting): it is laid out as ``ruff format`` would."""
INDENT = "    "


class ExportError(ValueError):
    """A trace that cannot be exported: ``where`` names the trace file, ``reason`` says why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: cannot export: {reason}")
        self.where = where
        self.reason = reason


def default_output_name(trace_path: str | Path) -> str:
    """The exported file's default name: ``test_<trace stem>_vllm.py``, the stem made an identifier."""
    stem = re.sub(r"\W+", "_", Path(trace_path).stem).strip("_") or "trace"
    return f"test_{stem}_vllm.py"


# -- layout: Python expressions laid out as ruff format lays them out -----------------------------


@attrs.frozen
class Atom:
    """Text that is never split: a name, a number, a short string, an attribute."""

    text: str


@attrs.frozen
class Item:
    """One element of a bracketed sequence, after its ``prefix`` (``name=`` or ``key: ``)."""

    value: Node
    prefix: str = ""


@attrs.frozen
class Seq:
    """A bracketed sequence: a call's arguments (``open`` is ``name(``), a list, a tuple, a set or a dict.

    ``explode`` lays it out one item per line with a trailing comma (ruff's magic trailing comma keeps it so).
    """

    open: str
    close: str
    items: tuple[Item, ...]
    explode: bool = False


@attrs.frozen
class Concat:
    """A string literal too long for a line, as implicitly concatenated parts, one per line."""

    parts: tuple[str, ...]


Node = Atom | Seq | Concat


def flat(node: Node) -> str | None:
    """The node on one line, or ``None`` when it must span several."""
    if isinstance(node, Atom):
        return node.text
    if isinstance(node, Concat):
        return node.parts[0] if len(node.parts) == 1 else None
    if node.explode and node.items:
        return None
    texts = [flat(item.value) for item in node.items]
    if any(text is None for text in texts):
        return None
    body = ", ".join(item.prefix + str(text) for item, text in zip(node.items, texts))
    if node.open == "(" and len(node.items) == 1:
        body += ","  # a one-element tuple
    return node.open + body + node.close


MAX_FILLED_ITEM_CHARS = 24
"""Items up to this long (an id, a ``(group, block)`` pair, ``block: count``) fill lines when filling."""


def lay_out(node: Node, indent: int, prefix: str = "", suffix: str = "", fill: bool = False) -> list[str]:
    """Lines for ``prefix + node + suffix`` at ``indent`` spaces, split at brackets as ruff format splits them.

    A sequence that does not fit is split after its opening bracket: a call's arguments on one line if
    they fit there, else (and always for a display of several elements) one per line with a trailing comma
    (no comma after a sole item, which has no delimiter).
    With ``fill``, a sequence of short items fills its lines instead of taking one per item (ruff format
    would not; the exported file marks that part ``fmt: off``).
    """
    pad = " " * indent
    one_line = flat(node)
    if one_line is not None and indent + len(prefix) + len(one_line) + len(suffix) <= LINE_LENGTH:
        return [pad + prefix + one_line + suffix]
    if isinstance(node, Atom):
        return [pad + prefix + node.text + suffix]
    if isinstance(node, Concat):
        lines = [pad + prefix + node.parts[0]]
        lines.extend(pad + part for part in node.parts[1:])
        lines[-1] += suffix
        return lines
    inner = indent + len(INDENT)
    lines = [pad + prefix + node.open]
    texts = [flat(item.value) for item in node.items]
    items = [item.prefix + text for item, text in zip(node.items, texts) if text is not None]
    body = ", ".join(items) if not node.explode and len(items) == len(node.items) else None
    # ruff format puts a split call's arguments on one line when they fit there, but gives each element of a
    # split list, dict, set or tuple display a line of its own (filling, the items share lines).
    hug = fill or len(node.items) == 1 or node.open not in ("[", "{", "(")
    if body is not None and hug and inner + len(body) <= LINE_LENGTH:
        lines.append(" " * inner + body)
    elif body is not None and fill and max(map(len, items)) <= MAX_FILLED_ITEM_CHARS:
        line = ""
        for text in items:
            if line and inner + len(line) + len(text) + 1 > LINE_LENGTH:
                lines.append(" " * inner + line.rstrip())
                line = ""
            line += text + ", "
        lines.append(" " * inner + line.rstrip())
    elif len(node.items) == 1 and not node.explode:
        lines.extend(lay_out(node.items[0].value, inner, node.items[0].prefix, fill=fill))
    else:
        for item in node.items:
            lines.extend(lay_out(item.value, inner, item.prefix, ",", fill))
    lines.append(pad + node.close + suffix)
    return lines


def string_node(text: str, room: int) -> Node:
    """A string literal, cut into implicitly concatenated parts of at most ``room`` characters when longer."""
    literal = _quote(text)
    if len(literal) <= room:
        return Atom(literal)
    parts: list[str] = []
    rest = text
    while rest:
        cut = len(rest)
        if len(_quote(rest)) > room:
            cut = max(1, room - 2)
            while len(_quote(rest[:cut])) > room:
                cut -= 1
            space = rest.rfind(" ", 0, cut)
            cut = space + 1 if space > 0 else cut
        parts.append(_quote(rest[:cut]))
        rest = rest[cut:]
    return Concat(tuple(parts))


def _quote(text: str) -> str:
    """A double-quoted string literal, as ruff format writes one."""
    literal = repr(text)
    if literal.startswith("'") and '"' not in text:
        literal = '"' + literal[1:-1].replace("\\'", "'") + '"'
    return literal


def call(function: str, *args: Node, **kwargs: Node) -> Seq:
    """A call node: positional ``args``, then keyword ``kwargs`` in order."""
    items = [Item(arg) for arg in args] + [Item(value, f"{name}=") for name, value in kwargs.items()]
    return Seq(f"{function}(", ")", tuple(items))


def exploded(node: Seq) -> Seq:
    """The sequence laid out one item per line, whatever its length."""
    return attrs.evolve(node, explode=True)


# -- values as expressions ------------------------------------------------------------------------------


def value_node(value: object, names: dict[int, str] | None = None) -> Node:
    """A literal for a value the exporter writes: ints, strings, None, bools, enums, and containers of them
    (ranges included); objects named in ``names`` (by id) are written as their names."""
    if names is not None and id(value) in names:
        return Atom(names[id(value)])
    if isinstance(value, enum.Enum):  # before int: vLLM's RequestStatus is an IntEnum
        return Atom(f"{type(value).__name__}.{value.name}")
    if value is None or isinstance(value, bool | int | float):
        return Atom(repr(value))
    if isinstance(value, str):
        return Atom(_quote(value))
    if isinstance(value, range):
        return Atom(repr(value))
    if isinstance(value, dict):
        return Seq("{", "}", tuple(Item(value_node(v, names), f"{flat(value_node(k))}: ") for k, v in value.items()))
    if isinstance(value, set | frozenset):
        if not value:
            return Atom("set()")
        return Seq("{", "}", tuple(Item(value_node(v, names)) for v in sorted(value)))
    if isinstance(value, tuple):
        return Seq("(", ")", tuple(Item(value_node(v, names)) for v in value))
    if isinstance(value, list):
        return Seq("[", "]", tuple(Item(value_node(v, names)) for v in value))
    raise TypeError(f"kvcheck export cannot write a {type(value).__name__} as a literal: {value!r}")


def nested_lists(groups: Iterable[Iterable[int]]) -> list[list[int]]:
    """Per-group ids as lists (the exported file's helpers return lists)."""
    return [list(group) for group in groups]


# -- recording ------------------------------------------------------------------------------------


@attrs.define
class Statement:
    """One statement of a step: ``prefix`` followed by a node (``prefix`` alone when ``node`` is None)."""

    prefix: str
    node: Node | None = None

    def lines(self, indent: int, fill: bool = False) -> list[str]:
        if self.node is None:
            return [" " * indent + self.prefix]
        return lay_out(self.node, indent, self.prefix, fill=fill)


class RequestProxy:
    """A vLLM request as the scheduler layer sees it: reads pass through; writes and appended tokens are
    recorded as statements of the exported file, then made on the request."""

    def __init__(self, request: Any, variable: str, recorder: RecordingTarget) -> None:
        object.__setattr__(self, "_request", request)
        object.__setattr__(self, "_variable", variable)
        object.__setattr__(self, "_recorder", recorder)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._request, name)
        if name == "append_output_token_ids":

            def append_output_token_ids(token_ids: int | list[int]) -> None:
                self._recorder.emit(f"{self._variable}.append_output_token_ids({flat(value_node(token_ids))})")
                value(token_ids)

            return append_output_token_ids
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._recorder.record_write(self._variable, self._request, name, value)
        setattr(self._request, name, value)


def unwrap(request: Any) -> Any:
    """The vLLM request behind a proxy (vLLM is always handed the request itself)."""
    return request._request if isinstance(request, RequestProxy) else request


FIXED_NAMES = frozenset(
    {
        "manager",
        "step",
        "hit",
        "hit_tokens",
        "request",
        "make_manager",
        "make_request",
        "test_kvcheck_trace",
        "vllm",
        "annotations",
        "SamplingParams",
        "get_hash_fn_by_name",
        "STR_DTYPE_TO_TORCH_DTYPE",
        "init_none_hash",
        "get_request_block_hasher",
        "KVCacheConfig",
        "KVCacheGroupSpec",
        "FullAttentionSpec",
        "SlidingWindowSpec",
        "SlidingWindowMLASpec",
        "ChunkedLocalAttentionSpec",
        "RSWASpec",
        "CircularBufferSpec",
        "CrossAttentionSpec",
        "MLAAttentionSpec",
        "MambaSpec",
        "Request",
        "RequestStatus",
        "EXPORTED_AGAINST_VLLM",
        "BLOCK_SIZES",
        "HASH_BLOCK_SIZE",
        "SCHEDULER_BLOCK_SIZE",
        "NUM_BLOCKS",
        "NUM_HASH_LOOKAHEAD_TOKENS",
        "MAX_MODEL_LEN",
        "SLOT_SIZED_GROUPS",
        "SPECULATIVE_BLOCKS",
        "GROUP_KINDS",
        "ENCODER_BLOCKS",
        "REUSE_ORDER_INVARIANT",
        *dir(builtins),
        *keyword.kwlist,
        *keyword.softkwlist,
    }
)
"""Names the exported file defines, imports or uses besides those in :data:`HELPERS`."""

EVENT_NAMES = frozenset({"stream", "Any", "AllBlocksCleared", "BlockRemoved", "BlockStored"})
"""Names the exported file uses besides those in :data:`EVENT_HELPERS` when the trace enables KV cache events."""


def reserved_names(events: bool = False) -> frozenset[str]:
    """Names a request's variable must not take: any the exported file uses (one assigned in the test
    function would make it local there), including every word of the helpers (whichever release's
    map reader they inline), comments included."""
    words = "\n".join(helpers(events, version) for version in CACHE_ENTRIES)
    return FIXED_NAMES | (EVENT_NAMES if events else frozenset()) | frozenset(re.findall(r"[A-Za-z_]\w*", words))


MAX_VARIABLE_CHARS = 24
"""A request id longer than this is not made a variable name (``request``, ``request_2``... instead)."""


@attrs.define
class PendingWrite:
    """The last statement written, when it is a write of a request field: a later write of the same field
    replaces it, and one back to the ``original`` value removes it."""

    variable: str
    field: str
    original: Any
    statement: Statement


def same_value(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b


class RecordingTarget(VllmTarget):
    """A ``VllmTarget`` that writes every call it makes to vLLM as a statement of the exported file.

    Each hook makes the same call as ``VllmTarget``'s and writes it first (so a call that raises is
    written too).  ``model_result`` (set by the exporter before each operation) gives the hit the step
    must adopt, asserted once the lookup's hit is cut back where a load supersedes its tail.
    """

    def __init__(self, config: TargetConfig) -> None:
        super().__init__(config)
        self.statements: list[Statement] = []
        self.model_result = StepResult()
        self.step = 0
        self.names: dict[int, str] = {}
        self.hit_request_id = ""
        """The request of the last lookup (``get_computed_blocks``), whose hit the step adopts."""
        self._named: list[object] = []  # keeps named objects alive, so that their ids stay theirs
        self._variables: set[str] = set()
        self._pending_write: PendingWrite | None = None

    # -- writing statements -------------------------------------------------

    def emit(self, prefix: str, node: Node | None = None) -> None:
        self.statements.append(Statement(prefix, node))

    def record_write(self, variable: str, request: Any, field: str, value: Any) -> None:
        """A scheduler-side write of a request field (a plain attribute), written out.

        Consecutive writes of one field keep the last value, and a write that leaves the field as it
        was is left out: nothing read the values in between.
        """
        pending = self._pending_write
        self._pending_write = None
        if (
            pending is not None
            and (pending.variable, pending.field) == (variable, field)
            and self.statements
            and self.statements[-1] is pending.statement
        ):
            self.statements.pop()
            original = pending.original
        else:
            original = getattr(request, field)
        if same_value(original, value):
            return
        statement = Statement(f"{variable}.{field} = ", value_node(value))
        self.statements.append(statement)
        self._pending_write = PendingWrite(variable, field, original, statement)

    def register(self, value: object, variable: str) -> str:
        """Give an object vLLM returned a variable name, for the later calls that pass it back."""
        self.names[id(value)] = variable
        self._named.append(value)
        return variable

    def new_variable(self, request_id: str) -> str:
        """A variable name for a new request: its id when that is a fitting identifier, else ``request``;
        a suffix ``_2``, ``_3``... when the name is taken (a request added again after it finished)."""
        base = request_id
        if (
            not request_id.isidentifier()
            or not request_id.isascii()
            or keyword.iskeyword(request_id)
            or request_id in reserved_names(self.config.enable_kv_cache_events)
            or request_id.startswith(("popped_", "reads_", "retained_", "pending_", "_"))
            or len(request_id) > MAX_VARIABLE_CHARS
        ):
            base = "request"
        variable, suffix = base, 1
        while variable in self._variables:
            suffix += 1
            variable = f"{base}_{suffix}"
        self._variables.add(variable)
        return variable

    def variable(self, request: Any) -> str:
        if not isinstance(request, RequestProxy):
            raise AssertionError(f"a request reached a hook unwrapped: {request!r}")
        return str(request._variable)

    # -- hooks --------------------------------------------------------------

    def _new_request(self, request_id: str, prompt: tuple[int, ...]) -> Any:
        variable = self.new_variable(request_id)
        events = self.config.enable_kv_cache_events
        room = LINE_LENGTH - (3 + events) * len(INDENT) - 1  # a part of the id, on its own line, then a comma
        made = call("make_request", string_node(request_id, room), value_node(list(prompt)))
        # With KV cache events the stream reads the request's block hashes, to read vLLM's events.
        self.emit(f"{variable} = ", call("stream.track", made) if events else made)
        return RequestProxy(super()._new_request(request_id, prompt), variable, self)

    def _get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        variable = self.variable(request)
        raw = unwrap(request)
        self.emit(
            f"hit, hit_tokens, {variable}.shared_prefix_boundary = ",
            call("manager.get_computed_blocks", Atom(variable)),
        )
        hit_blocks, hit_length, raw.shared_prefix_boundary = self.manager.get_computed_blocks(raw)
        hit = (hit_blocks, hit_length)
        self.register(hit, "hit")
        self.hit_request_id = raw.request_id
        return hit

    def _truncate_computed_blocks(self, blocks: Any, num_tokens: int) -> Any:
        self.emit("hit = ", call("manager.truncate_computed_blocks", Atom("hit"), value_node(num_tokens)))
        self.emit(f"hit_tokens = {num_tokens}")
        return super()._truncate_computed_blocks(blocks, num_tokens)

    def _adopted_hit(self, hit: tuple[Any, int], hit_length: int) -> tuple[Any, int]:
        # The hit the step adopts (cut back where a load supersedes its tail) is the one checked and passed on.
        adopted = super()._adopted_hit(hit, hit_length)
        self.register(adopted, "hit")
        expected = self.model_result
        request_id = self.hit_request_id
        if expected.hit_length is not None:
            self.expect(
                "hit_is_sound_and_maximal", f"hit length of {request_id} differs", expected.hit_length, "hit_tokens"
            )
            if expected.hit_block_ids is not None:
                blocks = nested_lists(expected.hit_block_ids)
                detail = f"hit blocks of {request_id} differ"
                self.expect("hit_is_sound_and_maximal", detail, blocks, "block_ids(hit.blocks)")
        if self.config.partial_hits:
            # A hit may end inside a block: the step checks that the request does not write the shared block.
            self.emit(f"step.hit = {_quote(request_id)}, hit, hit_tokens")
        return adopted

    def expect(self, invariant: str, detail: str, expected: object, actual: str) -> None:
        """Write ``step.expect(...)``: vLLM's value, the expression ``actual``, must be ``expected``."""
        room = LINE_LENGTH - 3 * len(INDENT) - 1
        arguments = (value_node(invariant), string_node(detail, room), value_node(expected), Atom(actual))
        self.emit("", call("step.expect", *arguments))

    def _allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        hit: tuple[Any, int] | None,
        external: int,
        num_lookahead_tokens: int,
        delay_cache_blocks: bool = False,
    ) -> Any:
        # The call VllmTarget._allocate_slots makes, written out first.
        raw = unwrap(request)
        if hit is not None and self.names.get(id(hit)) != "hit":
            raise AssertionError("allocate_slots was handed a hit that get_computed_blocks did not return")
        kwargs = self.allocate_slots_keywords(raw, hit, external, num_lookahead_tokens, delay_cache_blocks)
        # The hit is passed back as the variables get_computed_blocks returned it in.
        passed_back = {"num_new_computed_tokens": Atom("hit_tokens"), "new_computed_blocks": Atom("hit")}
        written = {
            name: passed_back[name] if hit is not None and name in passed_back else value_node(value)
            for name, value in kwargs.items()
        }
        variable = Atom(self.variable(request))
        self.emit("step.allocated = ", call("manager.allocate_slots", variable, value_node(num_new_tokens), **written))
        return self.manager.allocate_slots(raw, num_new_tokens, **kwargs)

    def _free(self, request: Any) -> None:
        self.emit(f"manager.free({self.variable(request)})")
        super()._free(unwrap(request))

    def _pop_blocks_for_free(self, request: Any) -> list[Any]:
        variable = f"popped_{self.step}"
        self.emit(f"{variable} = manager.pop_blocks_for_free({self.variable(request)})")
        popped = super()._pop_blocks_for_free(unwrap(request))
        self.register(popped, variable)
        return popped

    def _free_popped(self, popped: list[Any]) -> None:
        # VllmTarget frees through manager.block_pool, tail first, as the scheduler drains a deferred free.
        self.emit(f"manager.block_pool.free_blocks(reversed({self.names[id(popped)]}))")
        super()._free_popped(popped)

    def _take_block_copies(self) -> tuple[list[tuple[int, int]], list[Any]]:
        copies, retained = super()._take_block_copies()
        if self.config.partial_hits and retained:
            variable = f"retained_{self.step}"
            self.emit(f"step.copies, {variable} = manager.take_kv_cache_block_copies()")
            self.register(retained, variable)
        elif self.config.partial_hits:
            self.emit("step.copies = manager.take_kv_cache_block_copies()[0]")
        return copies, retained

    def _take_state_offloads(self) -> Mapping[str, Sequence[tuple[int, int, int]]]:
        if self.config.aligned_mamba_group_ids:
            # After every operation, as VllmTarget.apply drains them.
            self.emit("step.offload(manager.take_boundary_state_offloads())")
        return super()._take_state_offloads()

    def _finalize_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        if self.config.aligned_mamba_group_ids:
            variable = self.variable(request)
            self.emit(
                f"step.offload({{{_quote(request.request_id)}: manager.finalize_partial_tail_offloads({variable})}})"
            )
        return super()._finalize_tail_offloads(unwrap(request))

    def _take_new_block_ids(self) -> list[int]:
        if self.config.needs_zeroing:
            # After every operation, as VllmTarget.apply drains them.
            self.emit("step.zeroed = manager.take_new_block_ids()")
        return super()._take_new_block_ids()

    def _free_retained(self, blocks: list[Any]) -> None:
        # As the scheduler releases the endpoints of copies it does not defer.
        self.emit(f"manager.block_pool.free_blocks({self.names[id(blocks)]})")
        super()._free_retained(blocks)

    def _deferred_retained(self, blocks: list[Any]) -> list[Any]:
        pending = super()._deferred_retained(blocks)
        variable = f"pending_{self.step}"
        self.emit(f"{variable} = {self.names[id(blocks)]}[::-1]")
        self.register(pending, variable)
        return pending

    def _new_step_starts(self) -> None:
        self.emit("manager.new_step_starts()")
        super()._new_step_starts()

    def _cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        self.emit(f"manager.cache_blocks({self.variable(request)}, {num_computed_tokens})")
        super()._cache_blocks(unwrap(request), num_computed_tokens)

    def _take_events(self) -> list[Any]:
        # Once after every operation, as VllmTarget.apply takes them: read as plain values in the file.
        self.emit("step.events = stream.take(manager)")
        return super()._take_events()

    def _evict(self, block_ids: set[int]) -> None:
        self.emit("", call("manager.evict_blocks", value_node(set(block_ids))))
        super()._evict(block_ids)

    def _reset_prefix_cache(self) -> bool:
        self.emit("step.reset = manager.reset_prefix_cache()")
        return super()._reset_prefix_cache()

    def _reads(self, request: Any, num_computed_tokens: int, num_new_tokens: int) -> Any:
        reads = super()._reads(request, num_computed_tokens, num_new_tokens)
        if not self.config.async_scheduling:
            return reads
        variable = f"reads_{self.step}"
        positions = self._read_positions(request, num_computed_tokens, num_new_tokens)
        self.emit(
            f"{variable} = ",
            call("read_blocks", Atom("manager"), value_node(request.request_id), value_node(list(positions))),
        )
        self.register(reads, variable)
        return reads


# -- the exporter ---------------------------------------------------------------------------------------


@attrs.frozen
class FileFacts:
    """What the exported file says of itself: the trace's file name, the name to run it by, the vLLM release."""

    trace_name: str
    run_name: str
    vllm_version: str


@attrs.define
class ExportedStep:
    """One operation as exported: its statements, then the state check."""

    number: int
    op: Operation
    statements: list[Statement]
    check: Seq | None


def export_trace(trace: Trace, source_name: str | Path, output_name: str | None = None) -> str:
    """The text of a standalone pytest file that replays ``trace`` on vLLM (see the module docstring).

    ``source_name`` names the trace (errors quote it; the file quotes its last part only) and
    ``output_name`` the file written (its docstring says to run ``pytest OUTPUT_NAME``).  The same
    arguments and vLLM release give the same text.  Raises :class:`ExportError` for a trace that cannot
    be exported, and :class:`~kvcheck.targets.vllm_target.VllmUnavailable` when vLLM cannot be imported.
    """
    where = str(source_name)
    facts = FileFacts(Path(where).name, Path(output_name).name if output_name else "THIS_FILE", require_vllm().version)
    if not trace.ops:
        raise ExportError(where, "the trace has no operations")
    try:
        config = trace.config.validate()
    except ValueError as exc:
        raise ExportError(where, f"its configuration is invalid: {exc}") from None
    try:
        recorder = RecordingTarget(config)
        reference = VllmTarget(config)
    except Exception as exc:
        raise ExportError(where, f"vLLM cannot build a KVCacheManager for it: {type(exc).__name__}: {exc}") from exc
    model = ManagerModel(config, semantics_in_force())
    model_events = 0  # how many events of the model's stream earlier steps added
    steps: list[ExportedStep] = []
    verdict: InvariantViolation | None = None
    for number, op in enumerate(trace.ops, start=1):
        try:
            model_result = model.apply(op)
            model_obs = model.observe()
        except Exception as exc:
            raise ExportError(
                where, f"kvcheck's model cannot follow step {number} ({describe_op(op)}): {type(exc).__name__}: {exc}"
            ) from exc
        recorder.statements = []
        recorder.step = number
        recorder.model_result = model_result
        try:
            sut_result = recorder.apply(op)
            sut_obs = recorder.observe()
        except Exception as exc:
            _same_failure(reference, op, exc, number)
            detail = f"the target raised {type(exc).__name__}: {exc}"
            verdict = InvariantViolation("target_raised", number, describe_op(op), detail)
            steps.append(ExportedStep(number, op, recorder.statements, None))
            break
        if reference.apply(op) != sut_result or reference.observe() != sut_obs:
            raise RuntimeError(
                f"kvcheck export: the recorded calls left vLLM in another state than VllmTarget at step {number} "
                f"({describe_op(op)}); this is a bug in kvcheck/export.py"
            )
        step_events = model_obs.events[model_events:]
        model_events = len(model_obs.events)
        check = _check_call(recorder, op, model_result, model_obs, step_events)
        steps.append(ExportedStep(number, op, recorder.statements, check))
        try:
            check_all(StepCheck(number, op, config, sut_result, model_result, sut_obs, model_obs))
            recorder.check_internal()
        except InvariantViolation as violation:
            verdict = violation
            break
        except AssertionError as exc:
            verdict = InvariantViolation("target_self_check", number, describe_op(op), str(exc))
            break
    return _render(trace, facts, steps, verdict)


def _same_failure(reference: VllmTarget, op: Operation, exc: Exception, number: int) -> None:
    """The plain target must raise at the same operation as the recording one."""
    try:
        reference.apply(op)
    except Exception:
        return
    raise RuntimeError(
        f"kvcheck export: the recorded calls raised {type(exc).__name__}: {exc} at step {number} "
        f"({describe_op(op)}), where VllmTarget does not; this is a bug in kvcheck/export.py"
    ) from exc


def _check_call(
    recorder: RecordingTarget, op: Operation, result: StepResult, model: Observation, events: Iterable[CacheEvent]
) -> Seq:
    """``step.check(manager, ...)`` with the state the model predicts after the operation (and, with KV cache
    events, ``step.check(manager, stream, ...)`` with the ``events`` the model's stream adds at the step)."""
    kwargs: dict[str, Node] = {}
    if result.admitted is not None:
        kwargs["admitted"] = value_node(result.admitted)
    if result.new_block_ids is not None:
        kwargs["new_blocks"] = value_node(nested_lists(result.new_block_ids))
    if result.num_slots is not None:
        kwargs["slots"] = value_node({getattr(op, "request_id", ""): result.num_slots})
    if result.reset_done is not None:
        kwargs["reset_done"] = value_node(result.reset_done)
    if recorder.config.partial_hits and result.admitted:
        kwargs["copies"] = value_node([list(copy) for copy in result.block_copies])
    if recorder.config.needs_zeroing:
        kwargs["zeroed"] = value_node(list(result.zeroed_block_ids))
    if recorder.config.aligned_mamba_group_ids:
        kwargs["offloads"] = value_node([list(offload) for offload in result.state_offloads])
    tables = {rid: nested_lists(model.tables[rid]) for rid in sorted(model.tables)}
    kwargs["tables"] = value_node(tables)
    kwargs["free"] = value_node(list(model.free_order))
    kwargs["ref_counts"] = value_node({b: n for b, n in sorted(model.ref_counts.items()) if n})
    kwargs["cached"] = value_node(sorted((group, block) for group, _, block in model.cache_entries))
    config = recorder.config
    arguments = [Atom("manager")]
    if config.enable_kv_cache_events:
        arguments.append(Atom("stream"))
        kwargs["events"] = value_node([event_value(event) for event in events])
    if config.defer_block_free:
        pending = [popped for _, popped in recorder.pipeline.deferred]
        kwargs["pending_frees"] = value_node(pending, recorder.names)
        kwargs["deferred_frees"] = value_node(nested_lists(model.deferred_frees))
    if config.aligned_mamba_group_ids and model.draft_tokens:
        kwargs["draft_tokens"] = value_node({rid: model.draft_tokens[rid] for rid in sorted(model.draft_tokens)})
    if config.aligned_mamba_group_ids and model.state_tokens:
        kwargs["state_tokens"] = value_node({rid: model.state_tokens[rid] for rid in sorted(model.state_tokens)})
    if any(group.rules.keeps_prompt for group in config.groups):
        kwargs["prompt_lengths"] = value_node({rid: model.prompt_lengths[rid] for rid in sorted(model.tables)})
    if config.async_scheduling:
        held = list(recorder.pipeline.held_reads())
        for _, reads in held:
            if id(reads) not in recorder.names:
                raise AssertionError("a step in flight has reads that were never written out")
        kwargs["in_flight"] = value_node(held, recorder.names)
    return exploded(call("step.check", *arguments, **kwargs))


def event_value(event: CacheEvent) -> tuple[object, ...]:
    """A KV cache event of kvcheck's as the exported file's ``EventStream.take`` reads vLLM's: a plain value."""
    if isinstance(event, StoredEvent):
        lookahead = event.lookahead_token_ids
        return (
            "stored",
            event.group,
            [list(prefix) for prefix in event.prefixes],
            None if event.parent is None else list(event.parent),
            list(event.token_ids),
            event.block_size,
            None if lookahead is None else [list(ids) for ids in lookahead],
        )
    if isinstance(event, RemovedEvent):
        return ("removed", event.group, list(event.prefix))
    return ("cleared",)


# -- the file -------------------------------------------------------------------------------------------


def _render(trace: Trace, facts: FileFacts, steps: list[ExportedStep], verdict: InvariantViolation | None) -> str:
    events = trace.config.enable_kv_cache_events
    _drop_unused_variables(steps, events)
    body = _body(steps, events, fill=True)
    lines = [
        _docstring(trace, facts, verdict),
        "",
        _imports(trace.config, set(re.findall(r"[A-Za-z_]\w*", "\n".join(body)))),
        "",
        _constants(trace.config, facts.vllm_version),
        "",
        "",
        _make_manager(trace.config),
        "",
        "",
        helpers(events, facts.vllm_version),
        "",
        "",
        "def test_kvcheck_trace() -> None:",
        f'{INDENT}"""The trace\'s operations on vLLM, each followed by the state kvcheck\'s model predicts."""',
    ]
    if body != _body(steps, events, fill=False):
        lines.append(
            f"{INDENT}# Long lists of ids fill their lines here; ruff format would give each id a line of its own."
        )
        lines.append(f"{INDENT}# fmt: off")
    return "\n".join([*lines, *body, ""])


def _body(steps: list[ExportedStep], events: bool, fill: bool) -> list[str]:
    """The test function's statements: the manager (and the KV cache event stream, with ``events``), then each
    step in its ``with Step(...)`` block."""
    indent = len(INDENT)
    body = [f"{INDENT}manager = make_manager()"]
    if events:
        body.append(f"{INDENT}stream = EventStream()")
    for step in steps:
        description = string_node(describe_op(step.op), LINE_LENGTH - 2 * indent - 1)
        body.extend(lay_out(call("Step", Atom(str(step.number)), description), indent, "with ", " as step:"))
        for statement in step.statements:
            body.extend(statement.lines(2 * indent, fill))
        if step.check is not None:
            body.extend(lay_out(step.check, 2 * indent, fill=fill))
        elif not step.statements:
            body.append(f"{INDENT * 2}pass")
    return body


def _drop_unused_variables(steps: list[ExportedStep], events: bool) -> None:
    """Write ``manager.pop_blocks_for_free(r0)`` rather than ``popped_3 = ...`` when nothing later uses
    ``popped_3`` (an empty list is never freed), and so for a request never scheduled."""
    function = ast.parse("\n".join(["def test():", *_body(steps, events, fill=False)]))
    read = {node.id for node in ast.walk(function) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    for step in steps:
        for statement in step.statements:
            match = re.fullmatch(r"([A-Za-z_]\w*) = (.*)", statement.prefix, re.DOTALL)
            if match and match[1] not in read:
                statement.prefix = match[2]


def _wrap(text: str, width: int = 100, indent: str = "") -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False
    ) or [indent.rstrip()]


def _docstring(trace: Trace, facts: FileFacts, verdict: InvariantViolation | None) -> str:
    from kvcheck.faults import VLLM_FAULTS

    config = trace.config
    lines = [f"kvcheck trace {facts.trace_name}, replayed on vLLM's KVCacheManager.", ""]
    lines += _wrap(
        f"Exported by `kvcheck export` against vLLM {facts.vllm_version}.  It imports vLLM and the Python "
        f"standard library only; with vLLM {facts.vllm_version} installed (the CPU build is enough) run it "
        f"with `pytest {facts.run_name}`."
    )
    lines.append("")
    lines += _wrap(
        "The test builds vLLM's KVCacheManager for the trace's configuration and drives it through the "
        "trace's operations the way vLLM's scheduler does: the same calls in the same order, with the request "
        "fields the scheduler sets written between them.  After every step it checks vLLM's own consistency "
        "(no block held twice, ref counts equal to holders, a well-formed free queue, a prefix-cache map that "
        "agrees with the block hashes, blocks for every scheduled slot and every step in flight), then the "
        "state kvcheck's reference model of the allocator predicts: the prefix hit, the admission, the new "
        "blocks, every request's block table per KV-cache group, the free queue head to tail, every block's "
        "ref count and the (group, block id) pairs in the prefix-cache map.  "
        + (
            "With KV cache events enabled, it takes vLLM's events after every step, as vLLM's scheduler does, "
            "reads their block hashes as the token prefixes they stand for, and checks that the stream replayed "
            "from the start holds exactly the prefix-cache map's (group, prefix) entries (events_match_cache) "
            "and that each step's events are the ones the model predicts (events_match_model).  "
            if config.enable_kv_cache_events
            else ""
        )
        + "A failure names the kvcheck invariant, the step and the operation, with the expected (model) and "
        "actual (vLLM) values; an exception raised by vLLM is reported as target_raised."
    )
    lines.append("")
    if trace.expect is not None:
        fault = trace.expect.fault
        if fault is None:
            expectation = f"kvcheck expects this trace to fail with {trace.expect.invariant}."
        elif fault in VLLM_FAULTS:
            expectation = (
                f"kvcheck expects this trace to fail with {trace.expect.invariant} when the fault {fault} is "
                f"planted into vLLM ({VLLM_FAULTS[fault].description})."
            )
        else:
            expectation = (
                f"kvcheck expects this trace to fail with {trace.expect.invariant} when the fault {fault} is "
                "planted into kvcheck's own allocator, kvcore (it has no vLLM form in kvcheck's catalogue)."
            )
        lines += _wrap(expectation)
    if trace.provenance is not None:
        source = trace.provenance
        lines += _wrap(f"Provenance: {source.source}, {source.date}: {source.story}")
    if trace.expect is not None or trace.provenance is not None:
        lines.append("")
    lines += _wrap(f"Configuration: {config.describe()}.")
    lines.append("Operations:")
    for number, op in enumerate(trace.ops, start=1):
        lines += _wrap(f"{number:>3}  {describe_op(op)}", indent="    ")
    lines.append("")
    if verdict is None:
        lines += _wrap(f"When exported, every step held on vLLM {facts.vllm_version}.")
    else:
        omitted = len(trace.ops) - verdict.step
        rest = f"; the {omitted} operation(s) after it are left out" if omitted else ""
        lines += _wrap(
            f"When exported, kvcheck found this on vLLM {facts.vllm_version}, so the test fails at step "
            f"{verdict.step}{rest}:"
        )
        for line in str(verdict).splitlines():
            lines += _wrap(line.strip(), indent=INDENT * (1 + line.startswith(" ")))
    text = "\n".join(lines).replace("\\", "/").replace('"""', "'''")
    return '"""' + text + '\n"""'


def _imports(config: TargetConfig, uses: set[str]) -> str:
    specs = {kind_of(group.kind).vllm_spec_name for group in config.groups}
    interface = sorted(specs | {"KVCacheConfig", "KVCacheGroupSpec"})
    request_names = ["Request"] + (["RequestStatus"] if "RequestStatus" in uses else [])
    lines = [
        "from __future__ import annotations",
        "",
        "from collections import Counter",
        "from collections.abc import Sequence",
        "from types import TracebackType",
        "from typing import Any, NoReturn" if config.enable_kv_cache_events else "from typing import NoReturn",
        "",
        "import vllm",
    ]
    utils = ["KVCacheBlock", "get_group_id", "get_request_block_hasher", "init_none_hash"]
    if config.enable_kv_cache_events:
        lines.append("from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored")
        utils = sorted([*utils, "get_block_hash", "maybe_convert_block_hash"], key=lambda name: (name.islower(), name))
    lines += [
        "from vllm.sampling_params import SamplingParams",
        "from vllm.utils.hashing import get_hash_fn_by_name",
        "from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE",
        "from vllm.v1.core.block_pool import BlockPool",
        "from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager",
    ]
    utils_import = f"from vllm.v1.core.kv_cache_utils import {', '.join(utils)}"
    if len(utils_import) <= LINE_LENGTH:
        lines.append(utils_import)
    else:
        lines += lay_out(
            Seq("from vllm.v1.core.kv_cache_utils import (", ")", tuple(Item(Atom(n)) for n in utils), True), 0
        )
    lines += lay_out(
        Seq("from vllm.v1.kv_cache_interface import (", ")", tuple(Item(Atom(n)) for n in interface), True), 0
    )
    lines.append(f"from vllm.v1.request import {', '.join(request_names)}")
    return "\n".join(lines)


def _constants(config: TargetConfig, vllm_version: str) -> str:
    reuse = "lru_eviction_when_caching_on" if config.enable_caching else "lifo_head_reuse_when_caching_off"
    return "\n".join(
        [
            f"EXPORTED_AGAINST_VLLM = {_quote(vllm_version)}",
            f"BLOCK_SIZES = {list(config.block_sizes)}",
            '"""Tokens a block of each group holds (over every decode context parallel rank)."""',
            f"HASH_BLOCK_SIZE = {config.hash_size}",
            '"""Tokens per request block hash."""',
            f"SCHEDULER_BLOCK_SIZE = {config.scheduler_block_size}",
            f"NUM_BLOCKS = {config.num_blocks}",
            f"NUM_HASH_LOOKAHEAD_TOKENS = {config.num_hash_lookahead_tokens}",
            f"MAX_MODEL_LEN = {MAX_MODEL_LEN}",
            f"GROUP_KINDS = [{', '.join(_quote(group.kind) for group in config.groups)}]",
            f"ENCODER_BLOCKS = {_encoder_blocks(config)}",
            '"""Blocks a cross-attention group holds for the encoder\'s tokens."""',
            f"SLOT_SIZED_GROUPS = {[g for g, group in enumerate(config.groups) if group.kind not in UNCACHED_KINDS]}",
            '"""Groups holding a block per BLOCK_SIZES[group] positions (no ring buffer, no cross-attention)."""',
            f"SPECULATIVE_BLOCKS = {[group.speculative_blocks for group in config.groups]}",
            '"""Blocks a Mamba group reserves past its slots for draft states (0 for other groups)."""',
            f"NUM_LOOKAHEAD_TOKENS = {config.num_lookahead_tokens}",
            f"MAIN_MODEL_GROUPS = {[g for g, group in enumerate(config.groups) if group.rules.aligned_states]}",
            '"""Groups a drafter has no layers in (align-mode Mamba): their slots leave out the lookahead."""',
            f"MAX_LIVE_STATES = {_max_live_states(config)}",
            '"""Live states (checkpoints too) an align-mode Mamba table holds at most, beside speculative blocks."""',
            f"REUSE_ORDER_INVARIANT = {_quote(reuse)}",
            '"""kvcheck\'s invariant for the order in which blocks are handed out, with caching '
            + ("on" if config.enable_caching else "off")
            + '."""',
        ]
    )


def _max_live_states(config: TargetConfig) -> int:
    """Live states an align-mode Mamba table holds at most besides its speculative blocks: the state a
    step starts from and the one it writes, one more with a step in flight, and with prefill checkpoints
    one more per step not yet processed."""
    in_flight = int(config.async_scheduling)
    checkpoints = 0 if config.prefill_checkpoint_alignment is None else 1 + in_flight
    return 2 + in_flight + checkpoints


def _checkpoint_fields(group: GroupSpec) -> dict[str, Node]:
    """The MambaSpec fields of a group's prefill checkpoints (none without them)."""
    if group.prefill_checkpoint_alignment is None:
        return {}
    return {
        "num_prefill_checkpoint_blocks": value_node(1),
        "prefill_checkpoint_alignment": value_node(group.prefill_checkpoint_alignment),
    }


def _encoder_blocks(config: TargetConfig) -> int:
    """Blocks the cross-attention group (if any) holds for the encoder's tokens."""
    sizes = [size for group, size in zip(config.groups, config.block_sizes) if group.rules.encoder_blocks]
    return -(-config.num_encoder_tokens // sizes[0]) if sizes else 0


def _make_manager(config: TargetConfig) -> str:
    """``make_manager()``: the same arguments as :func:`kvcheck.targets.vllm_target.make_manager`."""
    specs = []
    for index, group in enumerate(config.groups):
        size: dict[str, Node] = {"block_size": value_node(config.spec_block_size(index))}
        # A group whose KV cache is in fp8 takes the layout with vLLM's fp8 cache dtype.
        layout_arg = Atom("**fp8_layout" if group.kv_cache_dtype == "fp8" else "**layout")
        if group.dcp_replicated:
            # As vLLM's model runner marks a draft model's layers running at DCP 1 under a DCP target.
            size["dcp_sharded"] = value_node(False)
        kind = kind_of(group.kind)
        if kind.mamba_cache_mode is not None:
            # One small state tensor: the allocator reads the block size, the mode and the speculative blocks.
            spec = call(
                kind.vllm_spec_name,
                shapes=value_node(((1,),)),
                dtypes=Atom('(STR_DTYPE_TO_TORCH_DTYPE["float32"],)'),
                block_size=value_node(config.spec_block_size(index)),
                mamba_cache_mode=value_node(kind.mamba_cache_mode),
                num_speculative_blocks=value_node(group.speculative_blocks),
                **_checkpoint_fields(group),
            )
        else:
            window: dict[str, Node] = (
                {} if kind.vllm_window_field is None else {kind.vllm_window_field: value_node(group.window)}
            )
            spec = call(kind.vllm_spec_name, layout_arg, **window, **size)
        # kvcheck's make_manager passes the window first; keyword order does not matter to vLLM.
        specs.append(
            call(
                "KVCacheGroupSpec",
                value_node([f"layers.{index}"]),
                spec,
                is_eagle_group=value_node(index in config.eagle_group_ids),
            )
        )
    layout = {"dtype": Atom('STR_DTYPE_TO_TORCH_DTYPE["float32"]')}
    layout_node = Seq(
        "{",
        "}",
        tuple(Item(v, f"{_quote(k)}: ") for k, v in layout.items())
        + tuple(Item(value_node(v), f"{_quote(k)}: ") for k, v in LAYER_LAYOUT.items()),
    )
    groups_node = Seq("[", "]", tuple(Item(spec) for spec in specs))
    manager_call = call(
        "KVCacheManager",
        Atom("config"),
        max_model_len=Atom("MAX_MODEL_LEN"),
        scheduler_block_size=Atom("SCHEDULER_BLOCK_SIZE"),
        hash_block_size=Atom("HASH_BLOCK_SIZE"),
        enable_caching=value_node(config.enable_caching),
        watermark=value_node(config.watermark),
        max_in_flight_tokens=value_node(config.max_in_flight_tokens),
        use_eagle=value_node(config.use_eagle),
        num_hash_lookahead_tokens=Atom("NUM_HASH_LOOKAHEAD_TOKENS"),
        num_prefill_lookahead=value_node(config.num_prefill_lookahead),
    )
    if config.enable_kv_cache_events:
        manager_call = attrs.evolve(
            manager_call, items=(*manager_call.items, Item(value_node(True), "enable_kv_cache_events="))
        )
    if config.dcp_world_size != 1:
        manager_call = attrs.evolve(
            manager_call, items=(*manager_call.items, Item(value_node(config.dcp_world_size), "dcp_world_size="))
        )
    if config.enable_mamba_shared_prefix_checkpoint:
        manager_call = attrs.evolve(
            manager_call,
            items=(*manager_call.items, Item(value_node(True), "enable_mamba_shared_prefix_checkpoint=")),
        )
    manager_call = exploded(manager_call)
    lines = [
        "def make_manager() -> KVCacheManager:",
        f'{INDENT}"""vLLM\'s KVCacheManager as vLLM\'s engine builds it for one model: one KV-cache group per '
        "attention",
        f"{INDENT}spec over one shared pool of NUM_BLOCKS blocks (the smallest attention layer: page sizes never "
        "matter to",
        f'{INDENT}the allocator), decode context parallelism as the engine passes it, no connector."""',
        f"{INDENT}# Once per process in vLLM's engine core, before any block is hashed.",
        f"{INDENT}init_none_hash(get_hash_fn_by_name({_quote(HASH_ALGORITHM)}))",
    ]
    if any(not group.rules.holds_state for group in config.groups):  # Mamba takes no layout
        lines += lay_out(layout_node, indent=4, prefix="layout = ")
    if any(group.kv_cache_dtype == "fp8" for group in config.groups):
        lines.append(f'{INDENT}fp8_layout = {{**layout, "dtype": STR_DTYPE_TO_TORCH_DTYPE["fp8"]}}')
    lines += lay_out(groups_node, indent=4, prefix="groups = ")
    retention: dict[str, Node] = {}
    if config.prefix_cache_retention_interval is not None:
        retention["prefix_cache_retention_interval"] = value_node(config.prefix_cache_retention_interval)
    config_call = call(
        "KVCacheConfig",
        num_blocks=Atom("NUM_BLOCKS"),
        kv_cache_tensors=Atom("[]"),
        kv_cache_groups=Atom("groups"),
        **retention,
    )
    lines += lay_out(config_call, indent=4, prefix="config = ")
    lines += lay_out(manager_call, indent=4, prefix="return ")
    lines += [
        "",
        "",
        "def make_request(request_id: str, prompt: list[int]) -> Request:",
        f'{INDENT}"""A waiting request whose block hashes vLLM chains every HASH_BLOCK_SIZE tokens with '
        f'{HASH_ALGORITHM} (its default)."""',
        f"{INDENT}block_hasher = get_request_block_hasher("
        f"HASH_BLOCK_SIZE, get_hash_fn_by_name({_quote(HASH_ALGORITHM)}), NUM_HASH_LOOKAHEAD_TOKENS)",
        f"{INDENT}return Request(request_id, prompt, SamplingParams(max_tokens=MAX_MODEL_LEN), None, "
        "block_hasher=block_hasher)",
    ]
    return "\n".join(lines)


HELPERS = '''\
def block_ids(groups: Sequence[Sequence[KVCacheBlock]]) -> list[list[int]]:
    """Block ids per KV-cache group."""
    return [[block.block_id for block in group] for group in groups]


def block_tables(manager: KVCacheManager) -> dict[str, list[list[int]]]:
    """Each request holding blocks, with its block ids per group (0 is the null block)."""
    request_ids: dict[str, None] = {}
    for group_manager in manager.coordinator.single_type_managers:
        request_ids.update(dict.fromkeys(group_manager.req_to_blocks))
    tables = {}
    for request_id in request_ids:
        table = block_ids(manager.coordinator.get_blocks(request_id))
        if any(table):
            tables[request_id] = table
    return tables


def free_queue(pool: BlockPool, forward: bool = True) -> list[int]:
    """The free queue's block ids, head to tail by the forward links (or tail to head by the backward ones).

    The walk stops after more blocks than the pool holds, so that a corrupted (cyclic) queue still ends.
    """
    queue = pool.free_block_queue
    node = queue.fake_free_list_head.next_free_block if forward else queue.fake_free_list_tail.prev_free_block
    end = queue.fake_free_list_tail if forward else queue.fake_free_list_head
    ids: list[int] = []
    while node is not None and node is not end and len(ids) <= len(pool.blocks):
        ids.append(node.block_id)
        node = node.next_free_block if forward else node.prev_free_block
    return ids


def block_ref_counts(pool: BlockPool) -> dict[int, int]:
    """Every block's ref_cnt but the null block's, leaving out the zeros."""
    return {block.block_id: block.ref_cnt for block in pool.blocks[1:] if block.ref_cnt}


MAP_ENTRIES_READER


def cache_entries(pool: BlockPool) -> set[tuple[bytes, int]]:
    """Every entry of the prefix-cache map as (block hash with group id, block id)."""
    return set(map_entries(pool))


def cached_blocks(entries: set[tuple[bytes, int]]) -> list[tuple[int, int]]:
    """Prefix-cache entries as sorted (group, block id) pairs."""
    return sorted((get_group_id(key), block_id) for key, block_id in entries)


def read_blocks(manager: KVCacheManager, request_id: str, positions: Sequence[Sequence[int]]) -> list[list[int]]:
    """The block ids at the positions a step reads and writes, per group (0 where the table has none yet)."""
    table = block_ids(manager.coordinator.get_blocks(request_id))
    return [[blocks[p] if p < len(blocks) else 0 for p in span] for blocks, span in zip(table, positions, strict=True)]


class InvariantViolation(AssertionError):
    """A kvcheck invariant failed on vLLM after a step."""


UNSET = object()
"""What Step.allocated and Step.reset hold until the step calls allocate_slots or reset_prefix_cache."""


class Step:
    """One operation of the trace: the vLLM calls made inside ``with Step(...)``, then the checks.

    A failed check raises InvariantViolation naming the kvcheck invariant, the step and the operation,
    with the expected value (kvcheck's model) and the actual one (vLLM); any other exception raised
    inside the step is vLLM's and is reported as kvcheck's target_raised.
    """

    def __init__(self, number: int, op: str) -> None:
        self.number = number
        self.op = op
        self.allocated: object = UNSET
        self.reset: object = UNSET
        self.hit: object = UNSET
        self.copies: object = UNSET
        self.zeroed: object = UNSET
        self.offloads: list[list[object]] = []

    def __enter__(self) -> Step:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if error is not None and not isinstance(error, InvariantViolation):
            version = f"vLLM {vllm.__version__}"
            if vllm.__version__ != EXPORTED_AGAINST_VLLM:
                version += f" (this test was exported against vLLM {EXPORTED_AGAINST_VLLM})"
            self.fail("target_raised", f"{version} raised {type(error).__name__}: {error}")

    def offload(self, offloads: dict[str, list[tuple[int, int, int]]]) -> None:
        """Keep boundary states the allocator offered a KV connector, as [request, group, block id, tokens]."""
        self.offloads += [[request_id, *offload] for request_id, entries in offloads.items() for offload in entries]

    def fail(self, invariant: str, detail: str, *values: object) -> NoReturn:
        """Raise the violation of ``invariant``; ``values`` are the expected and the actual value, if any."""
        message = f"{invariant} violated at step {self.number} ({self.op}): {detail}"
        if values:
            expected, actual = values
            message += f"\\n  expected: {expected!r}\\n  actual:   {actual!r}"
        raise InvariantViolation(message)

    def expect(self, invariant: str, detail: str, expected: object, actual: object) -> None:
        """Fail with ``invariant`` unless vLLM's ``actual`` value is the ``expected`` one."""
        if actual != expected:
            self.fail(invariant, detail, expected, actual)

    def check(
        self,
        manager: KVCacheManager,
        *,
        tables: dict[str, list[list[int]]],
        free: list[int],
        ref_counts: dict[int, int],
        cached: list[tuple[int, int]],
        admitted: bool | None = None,
        new_blocks: list[list[int]] | None = None,
        slots: dict[str, int] | None = None,
        reset_done: bool | None = None,
        pending_frees: Sequence[list[KVCacheBlock]] = (),
        deferred_frees: Sequence[list[int]] = (),
        prompt_lengths: dict[str, int] | None = None,
        in_flight: Sequence[tuple[str, list[list[int]]]] = (),
        copies: list[list[int]] | None = None,
        zeroed: list[int] | None = None,
        offloads: list[list[object]] | None = None,
        draft_tokens: dict[str, int] | None = None,
        state_tokens: dict[str, int] | None = None,
    ) -> None:
        """Check vLLM after the step, in the order kvcheck checks its invariants (so the first failure names
        the invariant kvcheck reports): vLLM's own consistency, then the state kvcheck's model predicts.

        The keywords are the model's prediction: whether the step was admitted, its new blocks, the slots
        it asked for, the reset's result, each request's table per group, the free queue head to tail,
        the nonzero ref counts, the cached (group, block id) pairs and the block ids each deferred free
        holds.  ``pending_frees`` are the block lists the scheduler popped for a deferred free and has not
        freed yet; ``prompt_lengths`` each request's prompt length (with R-SWA groups); ``in_flight`` the
        block ids each step still in flight reads and writes, per group; ``copies`` the (source,
        destination) block copies the step queued; ``zeroed`` the blocks it hands the worker to zero.
        ``offloads`` the boundary states offered a KV connector, as [request, group, block id, tokens];
        ``draft_tokens`` the most draft tokens a speculative step of each request scheduled and
        ``state_tokens`` the tokens each request's last step ran up to, drafts included (beside
        align-mode Mamba groups).
        """
        pool = manager.block_pool
        actual_tables = block_tables(manager)
        actual_refs = block_ref_counts(pool)
        actual_free = free_queue(pool)
        entries = cache_entries(pool)
        pending = [[block.block_id for block in blocks] for blocks in pending_frees]
        self._check_consistency(manager, actual_tables, actual_refs, actual_free, entries, pending)
        if isinstance(self.allocated, KVCacheBlocks):
            for request_id, num_slots in (slots or {}).items():
                for group, blocks in enumerate(block_ids(manager.coordinator.get_blocks(request_id))):
                    positions = num_slots - NUM_LOOKAHEAD_TOKENS * (group in MAIN_MODEL_GROUPS)
                    if group in SLOT_SIZED_GROUPS and len(blocks) * BLOCK_SIZES[group] < positions:
                        self.fail(
                            "scheduled_slots_have_blocks",
                            f"request {request_id} group {group} has {len(blocks)} blocks of "
                            f"{BLOCK_SIZES[group]} tokens for {positions} scheduled positions",
                        )
        self._check_group_kinds(pool, actual_tables, prompt_lengths, draft_tokens or {}, state_tokens or {})
        self._check_in_flight(actual_tables, pending, actual_free, in_flight)
        self._check_hit_not_written(actual_tables)
        actual_admitted = None if self.allocated is UNSET else self.allocated is not None
        self.expect("admission_matches_model", "admitted differs", admitted, actual_admitted)
        actual_cached = cached_blocks(entries)
        if self.allocated is None:
            for what, expected, actual in (
                ("free_order", free, actual_free),
                ("tables", tables, actual_tables),
                ("ref_counts", ref_counts, actual_refs),
                ("cache_entries", cached, actual_cached),
            ):
                detail = f"{what} changed by a refused allocation"
                self.expect("failed_allocation_changes_nothing", detail, expected, actual)
        if zeroed is not None:
            detail = "the blocks the step hands the worker to zero differ from the model's"
            self.expect("zeroed_blocks_are_fresh", detail, zeroed, self.zeroed)
        actual_new = block_ids(self.allocated.blocks) if isinstance(self.allocated, KVCacheBlocks) else None
        self.expect(REUSE_ORDER_INVARIANT, "newly allocated blocks differ", new_blocks, actual_new)
        self.expect(REUSE_ORDER_INVARIANT, "free queue order differs", free, actual_free)
        if copies is not None and isinstance(self.copies, list):
            actual_copies = [[copy.src_block_id, copy.dst_block_id] for copy in self.copies]
            self.expect("tables_match_model", "the block copies the step queued differ", copies, actual_copies)
        self.expect("tables_match_model", "the blocks held by deferred frees differ", list(deferred_frees), pending)
        for request_id in sorted(tables.keys() | actual_tables.keys()):
            detail = f"table of request {request_id} differs"
            self.expect("tables_match_model", detail, tables.get(request_id), actual_tables.get(request_id))
        self.expect("ref_cnt_matches_holders", "ref counts differ from the model's", ref_counts, actual_refs)
        self.expect("cache_matches_model", "cached (group, block id) pairs differ", cached, actual_cached)
        actual_reset = None if self.reset is UNSET else bool(self.reset)
        self.expect("reset_refused_only_while_held", "reset result differs", reset_done, actual_reset)
        if offloads is not None:
            detail = "the boundary states offered a connector differ from the model's"
            self.expect("state_offloads_well_formed", detail, offloads, self.offloads)
        null = pool.null_block
        standing = (null.block_id, null.is_null, null.prev_free_block is None, null.next_free_block is None)
        detail = "the null block is not block 0, marked null and out of the free queue"
        self.expect("target_self_check", detail, (0, True, True, True), standing)

    def _check_consistency(
        self,
        manager: KVCacheManager,
        tables: dict[str, list[list[int]]],
        refs: dict[int, int],
        free: list[int],
        entries: set[tuple[bytes, int]],
        pending: list[list[int]],
    ) -> None:
        """vLLM's own consistency, needing no model: kvcheck's first four invariants."""
        pool = manager.block_pool
        group_of: dict[int, int] = {}
        position_of: dict[int, tuple[int, str]] = {}
        for request_id, table in tables.items():
            for group, blocks in enumerate(table):
                held = [b for b in blocks if b]
                repeated = sorted(b for b, n in Counter(held).items() if n > 1)
                if repeated:
                    detail = f"request {request_id} group {group} holds block {repeated[0]} twice: table {blocks}"
                    self.fail("no_duplicate_block_ids", detail)
                for position, block_id in enumerate(blocks):
                    if not block_id:
                        continue
                    other_group = group_of.setdefault(block_id, group)
                    if other_group != group:
                        detail = (
                            f"block {block_id} is held in group {other_group} and in group {group} "
                            f"(request {request_id})"
                        )
                        self.fail("no_duplicate_block_ids", detail)
                    other_position, other_request = position_of.setdefault(block_id, (position, request_id))
                    if other_position != position:
                        detail = (
                            f"block {block_id} is block {other_position} of {other_request} and block {position} "
                            f"of {request_id}: not a shared prefix"
                        )
                        self.fail("no_duplicate_block_ids", detail)
        holders = Counter(b for table in tables.values() for blocks in table for b in blocks if b)
        holders.update(b for blocks in pending for b in blocks if b)
        detail = "ref counts differ from the number of table slots and deferred frees holding each block"
        self.expect("ref_cnt_matches_holders", detail, dict(sorted(holders.items())), refs)
        backward = free_queue(pool, forward=False)
        detail = "the free queue walked backward, reversed, differs from the forward walk"
        self.expect("free_queue_well_formed", detail, free, backward[::-1])
        num_free = pool.free_block_queue.num_free_blocks
        self.expect("free_queue_well_formed", "num_free_blocks differs from the queue length", len(free), num_free)
        unheld = sorted(block.block_id for block in pool.blocks[1:] if block.ref_cnt == 0)
        detail = "the free queue does not hold exactly the blocks with ref_cnt 0 (never the null block)"
        self.expect("free_queue_well_formed", detail, unheld, sorted(free))
        hashed = {(block.block_hash, block.block_id) for block in pool.blocks if block.block_hash is not None}
        # A full-attention block larger than the hashes is also cached under the partial key of a prompt boundary.
        hashed |= {(key, block_id) for block_id, keys in pool.cached_block_hashes_by_block.items() for key in keys}
        if entries != hashed:
            stale, missing = cached_blocks(entries - hashed), cached_blocks(hashed - entries)
            detail = f"map entries without a matching block hash: {stale}; hashed blocks not in the map: {missing}"
            self.fail("cache_map_consistent", detail)

    def _check_hit_not_written(self, tables: dict[str, list[list[int]]]) -> None:
        """After an admitted step whose hit ends inside a group's block, the request's table does not hold
        that (shared) block there, where it writes next."""
        if not isinstance(self.hit, tuple) or not isinstance(self.allocated, KVCacheBlocks):
            return
        request_id, hit, hit_tokens = self.hit
        for group, (blocks, table) in enumerate(zip(block_ids(hit.blocks), tables.get(request_id, []))):
            position = hit_tokens // BLOCK_SIZES[group]
            inside = hit_tokens % BLOCK_SIZES[group] and position < min(len(blocks), len(table)) and blocks[position]
            if inside and table[position] == blocks[position]:
                self.fail(
                    "hit_block_never_written",
                    f"request {request_id} group {group}: its {hit_tokens}-token hit ends inside block "
                    f"{blocks[position]}, which its table still holds for the tokens it writes next",
                )

    def _check_group_kinds(
        self,
        pool: BlockPool,
        tables: dict[str, list[list[int]]],
        prompt_lengths: dict[str, int] | None,
        draft_tokens: dict[str, int],
        state_tokens: dict[str, int],
    ) -> None:
        """What ring-buffer, cross-attention, R-SWA and Mamba groups keep, needing no model: a ring holds one
        block and cross-attention the encoder's blocks (none null or cached); R-SWA keeps every prompt block
        and frees one run of blocks after them; Mamba ends in its state blocks (1 + its speculative blocks
        at least), with null blocks only before them and none cached; align-mode Mamba ends in a live
        block and holds at most MAX_LIVE_STATES, its speculative blocks and one more per block its
        request's most draft tokens span, with a live block where its last step saved the state."""
        sized = (
            ("ring_holds_one_block", "ring", 1),
            ("cross_attention_holds_encoder_blocks", "cross_attention", ENCODER_BLOCKS),
        )
        for invariant, kind, size in sized:
            for request_id, table in sorted(tables.items()):
                for group, blocks in enumerate(table):
                    if GROUP_KINDS[group] != kind:
                        continue
                    if len(blocks) != size or 0 in blocks:
                        detail = (
                            f"request {request_id} group {group} ({kind}) must hold {size} block{'s' * (size != 1)}, "
                            "none null, while it holds any"
                        )
                        self.fail(invariant, detail, size, blocks)
                    cached = [b for b in blocks if pool.blocks[b].block_hash is not None]
                    if cached:
                        detail = f"request {request_id} group {group} ({kind}) has blocks in the prefix cache: {cached}"
                        self.fail(invariant, detail)
        for request_id, table in sorted(tables.items()):
            for group, blocks in enumerate(table):
                if GROUP_KINDS[group] != "rswa" or prompt_lengths is None:
                    continue
                prompt_blocks = -(-prompt_lengths[request_id] // BLOCK_SIZES[group])
                nulls = [position for position, b in enumerate(blocks) if not b]
                if any(position < prompt_blocks for position in nulls):
                    detail = (
                        f"request {request_id} group {group} (R-SWA) freed a block of its {prompt_blocks}-block prompt"
                    )
                    self.fail("rswa_keeps_the_prompt", detail, f"blocks at positions 0..{prompt_blocks - 1}", blocks)
                if nulls and nulls != list(range(nulls[0], nulls[-1] + 1)):
                    detail = f"request {request_id} group {group} (R-SWA) has null blocks in more than one run"
                    self.fail("rswa_keeps_the_prompt", detail, None, blocks)
        for request_id, table in sorted(tables.items()):
            for group, blocks in enumerate(table):
                if GROUP_KINDS[group] != "mamba":
                    continue
                tail = 1 + SPECULATIVE_BLOCKS[group]
                first_live = next((position for position, b in enumerate(blocks) if b), len(blocks))
                if 0 in blocks[first_live:] or len(blocks) - first_live < tail:
                    detail = (
                        f"request {request_id} group {group} (Mamba, {tail - 1} speculative) must end in {tail} or "
                        "more blocks, with null blocks only before them, while it holds any"
                    )
                    self.fail("mamba_keeps_a_state_tail", detail, f"null blocks, then {tail} or more blocks", blocks)
                cached = [b for b in blocks if b and pool.blocks[b].block_hash is not None]
                if cached:
                    detail = f"request {request_id} group {group} (Mamba) has blocks in the prefix cache: {cached}"
                    self.fail("mamba_keeps_a_state_tail", detail)
        for request_id, table in sorted(tables.items()):
            for group, blocks in enumerate(table):
                if GROUP_KINDS[group] != "mamba_align" or not blocks:
                    continue
                drafts = -(-draft_tokens.get(request_id, 0) // BLOCK_SIZES[group])
                limit = MAX_LIVE_STATES + SPECULATIVE_BLOCKS[group] + drafts
                if not blocks[-1] or len([b for b in blocks if b]) > limit:
                    detail = (
                        f"request {request_id} group {group} (Mamba, align mode) must end in a live block and hold "
                        f"at most {limit} live blocks, null blocks elsewhere"
                    )
                    self.fail("mamba_align_keeps_few_states", detail, f"at most {limit} live", blocks)
                if request_id not in state_tokens:
                    continue
                state = -(-state_tokens[request_id] // BLOCK_SIZES[group]) - 1
                if state >= len(blocks) - SPECULATIVE_BLOCKS[group] or not blocks[state]:
                    detail = (
                        f"request {request_id} group {group} (Mamba, align mode): its last step ended after token "
                        f"{state_tokens[request_id]}, so its state is saved at position {state}, which holds no "
                        "live block"
                    )
                    self.fail("mamba_align_keeps_few_states", detail, f"a live block at position {state}", blocks)

    def _check_in_flight(
        self,
        tables: dict[str, list[list[int]]],
        pending: list[list[int]],
        free: list[int],
        in_flight: Sequence[tuple[str, list[list[int]]]],
    ) -> None:
        """Every block a step still in flight reads is held: by its request's table, or a deferred free."""
        deferred = {b for blocks in pending for b in blocks}
        for request_id, reads in in_flight:
            table = tables.get(request_id, [])
            for group, blocks in enumerate(reads):
                held = table[group] if group < len(table) else []
                for block_id in blocks:
                    if not block_id:
                        detail = (
                            f"a step of request {request_id} in flight reads a position of group {group} that held "
                            f"no block when it was scheduled (reads {blocks})"
                        )
                        self.fail("in_flight_blocks_held", detail)
                    if block_id not in held and block_id not in deferred:
                        state = "free" if block_id in free else "held elsewhere"
                        detail = (
                            f"block {block_id} of group {group}, read by a step of request {request_id} still in "
                            f"flight, is {state}: neither in the request's table nor in a deferred free"
                        )
                        self.fail("in_flight_blocks_held", detail)'''


EVENT_HELPERS = '''\
Event = tuple[Any, ...]
"""A KV cache event as a plain value: ("stored", group, [prefix, ...], parent prefix or None, token ids, block size,
[lookahead token ids, ...] or None), ("removed", group, prefix) for each hash of a BlockRemoved, or ("cleared",); a
prefix is the list of token ids a block hash stands for."""


class EventStream:
    """vLLM's KV cache events, taken after every step as vLLM's scheduler takes them, block hashes read as prefixes.

    A block hash stands for the tokens of its block and of every block before it, and the NUM_HASH_LOOKAHEAD_TOKENS
    tokens after it; events publish it as maybe_convert_block_hash makes it.  The prefixes are read from the block
    hashes of every request made in the test (``track``), finished ones included.  ``view`` is the stream replayed
    from the start: how many prefix-cache entries of each (group, prefix) it reports.
    """

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.prefixes: dict[object, list[int]] = {}
        self.view: Counter[tuple[int, tuple[int, ...]]] = Counter()
        self.replayed = 0

    def track(self, request: Request) -> Request:
        """Read the block hashes of ``request`` from now on, the new ones as its tokens grow."""
        self.requests.append(request)
        return request

    def take(self, manager: KVCacheManager) -> list[Event]:
        """The events vLLM queued since the last take (manager.take_events()), as plain values."""
        for request in self.requests:
            tokens = request.all_token_ids
            for index, block_hash in enumerate(request.block_hashes):
                end = (index + 1) * HASH_BLOCK_SIZE + NUM_HASH_LOOKAHEAD_TOKENS
                self.prefixes.setdefault(maybe_convert_block_hash(block_hash), list(tokens[:end]))
        events: list[Event] = []
        for event in manager.take_events():
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash
                lookahead = event.lookahead_token_ids
                stored = (
                    "stored",
                    event.group_idx,
                    [self.prefix(block_hash) for block_hash in event.block_hashes],
                    None if parent is None else self.prefix(parent),
                    list(event.token_ids),
                    event.block_size,
                    None if lookahead is None else [list(ids) for ids in lookahead],
                )
                events.append(stored)
            elif isinstance(event, BlockRemoved):
                # One event per hash, as kvcheck reads a BlockRemoved.
                events.extend(("removed", event.group_idx, self.prefix(removed)) for removed in event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                events.append(("cleared",))
            else:
                raise TypeError(f"unknown KV cache event {event!r}")
        return events

    def prefix(self, block_hash: object) -> list[int]:
        """The token prefix a block hash, as events publish it, stands for."""
        if block_hash not in self.prefixes:
            raise LookupError(f"block hash {block_hash!r} is none of the block hashes of the test's requests")
        return self.prefixes[block_hash]

    def cached(self, entries: set[tuple[bytes, int]]) -> Counter[tuple[int, tuple[int, ...]]]:
        """The prefix-cache map's entries as (group, prefix) x count."""
        return Counter(
            (get_group_id(key), tuple(self.prefix(maybe_convert_block_hash(get_block_hash(key))))) for key, _ in entries
        )


def entry_counts(entries: Counter[tuple[int, tuple[int, ...]]]) -> str:
    """A few (group, prefix) x count, as text."""
    shown = [f"group {group} prefix {list(prefix)} x {count}" for (group, prefix), count in sorted(entries.items())]
    return "[" + "; ".join(shown[:3]) + ("; ..." if len(shown) > 3 else "") + "]"


def stored_event_problem(event: Event) -> str | None:
    """What makes a stored event malformed, if anything: it covers whole blocks of its group's size (or, for a
    full-attention group's partial entry, one hash unit) following its parent, and stores, block by block,
    prefixes of its parent and tokens up to a block (and the lookahead after)."""
    _, _, prefixes, parent, token_ids, block_size, lookahead_ids = event
    lookahead = NUM_HASH_LOOKAHEAD_TOKENS
    group = event[1]
    sizes = {BLOCK_SIZES[group]} | ({HASH_BLOCK_SIZE} if GROUP_KINDS[group] in ("full", "mla", "rswa") else set())
    if block_size not in sizes:
        return f"says blocks of {block_size} tokens, not {' or '.join(map(str, sorted(sizes)))}"
    if len(token_ids) % block_size or not token_ids:
        return f"covers {len(token_ids)} tokens, not a positive number of whole blocks"
    start = 0
    if parent is not None:
        if len(parent) <= lookahead or (len(parent) - lookahead) % block_size:
            return f"names a {len(parent)}-token parent prefix, not whole blocks"
        start = (len(parent) - lookahead) // block_size
    # The tokens the event speaks of: the parent's blocks, then its own.
    tokens = (parent or [])[: start * block_size] + token_ids
    end = start + len(token_ids) // block_size
    if parent is not None and tokens[: len(parent)] != parent[: len(tokens)]:
        return f"covers tokens {token_ids} that do not follow its parent {parent}"
    if (lookahead_ids is None) != (lookahead == 0):
        return f"has lookahead tokens {lookahead_ids} with hashes looking {lookahead} tokens ahead"
    last = start - 1
    for entry, prefix in enumerate(prefixes):
        position = (len(prefix) - lookahead) // block_size - 1
        whole = len(prefix) > lookahead and (len(prefix) - lookahead) % block_size == 0
        if not whole or not last < position < end:
            return f"stores a {len(prefix)}-token prefix, not the next whole block among positions {start}..{end - 1}"
        cut = (position + 1) * block_size
        if prefix[:cut] != tokens[:cut] or (parent is not None and prefix[: len(parent)] != parent):
            return f"stores prefix {prefix}, which is not its parent and tokens {tokens[:cut]}"
        if lookahead_ids is not None and lookahead_ids[entry] != prefix[cut:]:
            return f"gives lookahead tokens {lookahead_ids[entry]} for prefix {prefix}"
        last = position
    return None'''


EVENT_STREAM_CHECK = '''

    def _check_event_stream(self, stream: EventStream, entries: set[tuple[bytes, int]]) -> None:
        """kvcheck's events_match_cache: the step's events, replayed onto the stream's view from the start, are
        well formed and remove only entries the stream holds; the view then holds each (group, prefix) exactly as
        many times as the prefix-cache map does."""
        for event in self.events:
            index = stream.replayed
            stream.replayed += 1
            if event[0] == "cleared":
                stream.view.clear()
            elif event[0] == "removed":
                _, group, prefix = event
                if stream.view[group, tuple(prefix)] <= 0:
                    detail = (
                        f"event {index} removes group {group} prefix {prefix}, which the stream does not hold (never "
                        "stored, or removed already)"
                    )
                    self.fail("events_match_cache", detail)
                stream.view[group, tuple(prefix)] -= 1
            else:
                problem = stored_event_problem(event)
                if problem is not None:
                    self.fail("events_match_cache", f"stored event {index} (group {event[1]}) {problem}")
                stream.view.update((event[1], tuple(prefix)) for prefix in event[2])
        view, held = +stream.view, stream.cached(entries)
        if view != held:
            unheld, unreported = entry_counts(view - held), entry_counts(held - view)
            detail = (
                f"the event stream holds {unheld} beyond the cache (stored twice, or a removal not reported); the "
                f"cache holds {unreported} beyond the stream (a store not reported)"
            )
            self.fail("events_match_cache", detail)'''


def _after(anchor: str, addition: str) -> tuple[str, str]:
    """An edit of the helpers: ``addition`` right after ``anchor``."""
    return anchor, anchor + addition


EVENT_EDITS = (
    # (text of HELPERS, its replacement with KV cache events); each text is found exactly once.
    _after("        self.reset: object = UNSET\n", "        self.events: list[Event] = []\n"),
    (
        "        self,\n        manager: KVCacheManager,\n        *,\n",
        "        self,\n        manager: KVCacheManager,\n        stream: EventStream,\n        *,\n",
    ),
    _after(
        "        in_flight: Sequence[tuple[str, list[list[int]]]] = (),\n", "        events: Sequence[Event] = (),\n"
    ),
    _after(
        "        destination) block copies the step queued; ``zeroed`` the blocks it hands the worker to zero.\n",
        "        ``stream`` holds vLLM's KV cache events up to this step, ``self.events`` the step's; ``events`` are\n"
        "        the step's events the model predicts.\n",
    ),
    _after(
        "        self._check_consistency(manager, actual_tables, actual_refs, actual_free, entries, pending)\n",
        "        self._check_event_stream(stream, entries)\n",
    ),
    _after(  # kvcheck checks events_match_model last of its invariants, then the target's own check
        '        self.expect("reset_refused_only_while_held", "reset result differs", reset_done, actual_reset)\n',
        '        self.expect("events_match_model", "the KV cache events of the step differ", '
        "list(events), self.events)\n",
    ),
)


def map_reader(version: str) -> str:
    """The source of ``map_entries(pool)``, the prefix-cache map's reader as vLLM ``version`` lays the map
    out, taken from :mod:`kvcheck.targets.vllm_internals` (the one place kvcheck reads vLLM's internals)."""
    reader = layout(version, CACHE_ENTRIES)
    source = inspect.getsource(reader)
    header = f"def {reader.__name__}(pool: Any) -> list[tuple[bytes, int]]:"
    if source.count(header) != 1:
        raise AssertionError(f"kvcheck export: {reader.__name__} lost its header {header!r}; a bug in kvcheck")
    return source.replace(header, "def map_entries(pool: BlockPool) -> list[tuple[bytes, int]]:").rstrip("\n")


def helpers(events: bool, version: str) -> str:
    """The exported file's helpers for vLLM ``version``: :data:`HELPERS` with that release's map reader;
    with KV cache events, also :data:`EVENT_HELPERS` and the event checks in ``Step.check``, where kvcheck
    checks ``events_match_cache`` and ``events_match_model``."""
    text = HELPERS.replace("MAP_ENTRIES_READER", map_reader(version))
    if not events:
        return text
    invariant_class = "\n\n\nclass InvariantViolation(AssertionError):"
    for old, replacement in (*EVENT_EDITS, (invariant_class, "\n\n\n" + EVENT_HELPERS + invariant_class)):
        if text.count(old) != 1:
            raise AssertionError(f"kvcheck export: the helpers lost {old!r}; this is a bug in kvcheck/export.py")
        text = text.replace(old, replacement)
    return text + EVENT_STREAM_CHECK
