"""Traces: portable, versioned JSON records of a run, and their strict loading.

A trace holds the target configuration, the operations in order, an
optional expectation (it fails with a named invariant when a named fault is
planted) and optional provenance (where it came from, when, and its story).
Traces are data: they are parsed with ``json`` and checked field by field;
nothing in them is evaluated or unpickled.  A malformed trace, or one with a
value above its limit (:mod:`kvmodel.limits`), raises :class:`TraceError`,
which names the file, the step and the field.
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import attrs

from kvmodel.config import TargetConfig
from kvmodel.config_checks import ConfigError, is_int
from kvmodel.fields import declarations, is_required
from kvmodel.group_spec import GroupSpec
from kvmodel.limits import (
    MAX_DRAFT_TOKENS,
    MAX_EVICT_BLOCK_IDS,
    MAX_NUM_BLOCKS,
    MAX_OPS,
    MAX_PROMPT_TOKENS,
    MAX_REQUEST_ID_CHARS,
    MAX_SCHEDULE_TOKENS,
    MAX_TOKEN_ID,
    MAX_TRACE_BYTES,
    MAX_TRACE_PROMPT_TOKENS,
    above,
    shown,
)
from kvmodel.ops import OPERATION_TYPES, OPTIONAL_FIELDS, Operation, Schedule, first_reference_error, op_to_json

FORMAT = "kvcheck-trace"
VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("trace.schema.json")


@attrs.define(auto_exc=True, str=False)
class TraceError(ValueError):
    """A trace file is malformed: ``where`` names the file, ``step`` the operation (from 1), ``field`` the field."""

    where: str
    step: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        parts = [self.where]
        if self.step is not None:
            parts.append(f"step {self.step}")
        if self.field is not None:
            parts.append(f"field '{self.field}'")
        return ": ".join(parts) + f": {self.message}"


@attrs.frozen
class Expectation:
    """The trace fails with ``invariant`` when ``fault`` is planted into kvcore (and passes without it)."""

    invariant: str
    fault: str | None = None


@attrs.frozen
class Provenance:
    """Where a trace came from: ``source`` is ``fault:NAME`` or ``finding:NAME``."""

    source: str
    date: str
    story: str


@attrs.frozen
class Trace:
    config: TargetConfig
    ops: tuple[Operation, ...]
    expect: Expectation | None = None
    provenance: Provenance | None = None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "config": self.config.to_json(),
        }
        if self.provenance is not None:
            document["provenance"] = attrs.asdict(self.provenance)
        if self.expect is not None:
            document["expect"] = {"fails": self.expect.invariant, "fault": self.expect.fault}
        document["ops"] = [op_to_json(op) for op in self.ops]
        return document

    def dumps(self) -> str:
        """The trace as JSON text, one operation per line."""
        document = self.to_json()
        ops = document.pop("ops")
        head = json.dumps(document, indent=2)
        lines = ",\n".join("    " + json.dumps(op) for op in ops)
        return head[:-2] + ',\n  "ops": [\n' + lines + "\n  ]\n}\n"


# -- loading ------------------------------------------------------------------

# (minimum, maximum) of each integer field of an operation.
_INT_FIELDS = {
    "num_draft_tokens": (1, MAX_DRAFT_TOKENS),
    "num_accepted_tokens": (0, MAX_DRAFT_TOKENS),
    "num_new_tokens": (1, MAX_SCHEDULE_TOKENS),
    "num_external_tokens": (0, MAX_SCHEDULE_TOKENS),
    "sampled_token": (0, MAX_TOKEN_ID),
}


def _field_name(key: str) -> str:
    """A key as a field name in a message: cut short when a trace holds an absurdly long one."""
    return key if len(key) <= 60 else shown(key)


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where
        self.prompt_tokens = 0

    def fail(self, message: str, step: int | None = None, field: str | None = None) -> TraceError:
        return TraceError(self.where, step, field, message)

    def object(self, value: builtins.object, field: str, step: int | None = None) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(f"expected an object, got {type(value).__name__} {shown(value)}", step, field)
        return value

    def keys(
        self, value: dict[str, Any], required: set[str], optional: set[str], field: str | None, step: int | None = None
    ) -> None:
        prefix = f"{field}." if field else ""
        for key in sorted(required - value.keys()):
            raise self.fail("missing", step, prefix + key)
        for key in sorted(value.keys() - required - optional):
            raise self.fail(
                f"unknown field (expected one of: {', '.join(sorted(required | optional))})",
                step,
                prefix + _field_name(key),
            )

    def integer(self, value: builtins.object, field: str, minimum: int, maximum: int, step: int | None = None) -> int:
        if not is_int(value):
            raise self.fail(f"expected an integer, got {type(value).__name__} {shown(value)}", step, field)
        if value < minimum:
            raise self.fail(f"must be >= {minimum}, got {shown(value)}", step, field)
        if value > maximum:
            raise self.fail(above(value, maximum), step, field)
        return value

    def string(self, value: builtins.object, field: str, step: int | None = None, max_chars: int | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(f"expected a non-empty string, got {shown(value)}", step, field)
        if max_chars is not None and len(value) > max_chars:
            raise self.fail(above(len(value), max_chars, "characters"), step, field)
        return value

    def int_list(
        self, value: builtins.object, field: str, bounds: tuple[int, int], max_items: tuple[int, str], step: int
    ) -> tuple[int, ...]:
        """A non-empty list of at most ``max_items`` (count, unit) integers, each within ``bounds`` (min, max)."""
        if not isinstance(value, list) or not value:
            raise self.fail(f"expected a non-empty list of integers, got {shown(value)}", step, field)
        if len(value) > max_items[0]:
            raise self.fail(above(len(value), *max_items), step, field)
        return tuple(self.integer(item, f"{field}[{i}]", *bounds, step) for i, item in enumerate(value))

    def config(self, value: builtins.object) -> TargetConfig:
        raw = self.declared(self.object(value, "config"), TargetConfig, "config")
        config = TargetConfig(**raw)
        try:
            return config.validate()
        except ConfigError as exc:
            raise self.fail(exc.detail, None, f"config.{exc.field}") from None

    def declared(self, raw: dict[str, Any], cls: type[Any], field: str) -> dict[str, Any]:
        """The keyword arguments of ``cls`` that ``raw`` states: the keys its declared fields name (those
        without a default required), the group specs read in turn; a value's range is the
        configuration check's."""
        attributes = list(declarations(cls))
        required = {attribute.name for attribute, _ in attributes if is_required(attribute)}
        self.keys(raw, required, {attribute.name for attribute, _ in attributes} - required, field)
        kwargs: dict[str, Any] = {}
        for attribute, declaration in attributes:
            if attribute.name not in raw:
                continue
            item, name = raw[attribute.name], f"{field}.{attribute.name}"
            if declaration.holds in ("groups", "group_ids"):
                if not isinstance(item, list):
                    what = "a list of group indices" if declaration.holds == "group_ids" else "a list"
                    raise self.fail(f"expected {what}, got {shown(item)}", None, name)
                if len(item) > declaration.maximum:
                    raise self.fail(above(len(item), declaration.maximum, "groups"), None, name)
            if declaration.holds == "groups":
                item = tuple(
                    GroupSpec(**self.declared(self.object(group, f"{name}[{index}]"), GroupSpec, f"{name}[{index}]"))
                    for index, group in enumerate(item)
                )
            kwargs[attribute.name] = item
        return kwargs

    def op(self, value: builtins.object, step: int) -> Operation:
        raw = self.object(value, "op", step)
        if "op" not in raw:
            raise self.fail("missing", step, "op")
        name = raw["op"]
        if not isinstance(name, str) or name not in OPERATION_TYPES:
            raise self.fail(f"unknown operation {shown(name)} (known: {', '.join(OPERATION_TYPES)})", step, "op")
        cls = OPERATION_TYPES[name]
        fields = {a.name for a in attrs.fields(cls)}
        optional = fields & OPTIONAL_FIELDS.keys()
        self.keys(raw, fields - optional | {"op"}, optional, None, step)
        kwargs: dict[str, Any] = {}
        for field in sorted(fields & raw.keys()):
            item = raw[field]
            if field == "same_step":
                if not isinstance(item, bool):
                    raise self.fail(f"expected true or false, got {shown(item)}", step, field)
                kwargs[field] = item
            elif field == "request_id":
                kwargs[field] = self.string(item, field, step, MAX_REQUEST_ID_CHARS)
            elif field == "prompt":
                kwargs[field] = self.int_list(item, field, (0, MAX_TOKEN_ID), (MAX_PROMPT_TOKENS, "tokens"), step)
                self.prompt_tokens += len(kwargs[field])
                if self.prompt_tokens > MAX_TRACE_PROMPT_TOKENS:
                    raise self.fail(
                        f"the prompts up to here hold {self.prompt_tokens} tokens, "
                        f"above the limit of {MAX_TRACE_PROMPT_TOKENS} for a whole trace",
                        step,
                        field,
                    )
            elif field == "block_ids":
                bounds = (0, MAX_NUM_BLOCKS - 1)
                kwargs[field] = self.int_list(item, field, bounds, (MAX_EVICT_BLOCK_IDS, "block ids"), step)
            else:
                kwargs[field] = self.integer(item, field, *_INT_FIELDS[field], step)
        return cls(**kwargs)

    def check_references(self, ops: list[Operation], config: TargetConfig) -> None:
        error = first_reference_error(ops, config.num_blocks)
        if error is not None:
            index, field, message = error
            raise self.fail(message, index + 1, field)


def parse_trace(text: str, where: str = "<trace>") -> Trace:
    """Parse and validate trace text; raises :class:`TraceError` naming what is wrong.

    Every value is checked against its limit in :mod:`kvmodel.limits`, so a
    trace that loads replays in bounded time and memory.
    """
    reader = _Reader(where)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise reader.fail(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise reader.fail("not valid JSON: nested too deeply to read") from None
    except ValueError as exc:  # a number with more digits than Python converts
        raise reader.fail(f"not valid JSON: {str(exc).partition(':')[0]}") from None
    document = reader.object(document, "(top level)")
    reader.keys(document, {"format", "version", "config", "ops"}, {"expect", "provenance"}, None)
    if document["format"] != FORMAT:
        raise reader.fail(f"expected {FORMAT!r}, got {shown(document['format'])}", None, "format")
    if type(document["version"]) is not int or document["version"] != VERSION:
        raise reader.fail(
            f"unsupported version {shown(document['version'])}; this kvcheck reads version {VERSION}", None, "version"
        )
    config = reader.config(document["config"])
    ops_raw = document["ops"]
    if not isinstance(ops_raw, list):
        raise reader.fail(f"expected a list of operations, got {type(ops_raw).__name__}", None, "ops")
    if len(ops_raw) > MAX_OPS:
        raise reader.fail(above(len(ops_raw), MAX_OPS, "operations"), None, "ops")
    ops = [reader.op(item, step) for step, item in enumerate(ops_raw, start=1)]
    reader.check_references(ops, config)
    if config.async_scheduling:
        for step, op in enumerate(ops, start=1):
            if isinstance(op, Schedule) and op.same_step:
                raise reader.fail(
                    "true with async scheduling: a step in flight holds one request here, so a step of "
                    "several requests is not modelled",
                    step,
                    "same_step",
                )
    expect = None
    if "expect" in document:
        raw = reader.object(document["expect"], "expect")
        reader.keys(raw, {"fails"}, {"fault"}, "expect")
        fault = raw.get("fault")
        if fault is not None:
            reader.string(fault, "expect.fault")
        expect = Expectation(reader.string(raw["fails"], "expect.fails"), fault)
    provenance = None
    if "provenance" in document:
        raw = reader.object(document["provenance"], "provenance")
        reader.keys(raw, {"source", "date", "story"}, set(), "provenance")
        provenance = Provenance(*(reader.string(raw[k], f"provenance.{k}") for k in ("source", "date", "story")))
    return Trace(config, tuple(ops), expect, provenance)


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file; one larger than ``MAX_TRACE_BYTES`` is refused before it is read."""
    path = Path(path)
    where = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise TraceError(where, None, None, f"file size {above(size, MAX_TRACE_BYTES, 'bytes')}")
        with path.open("rb") as stream:
            # Read no more than the limit allows, whatever the size said (a device or a growing file).
            data = stream.read(MAX_TRACE_BYTES + 1)
    except OSError as exc:
        raise TraceError(where, None, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(where, None, None, f"file size is above the limit of {MAX_TRACE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(where, None, None, f"not UTF-8 text: byte {exc.start} cannot be decoded") from None
    return parse_trace(text, where)
