"""The trace format: malformed traces, and traces with a value beyond its limit, are refused with an error
naming file, step and field; good traces round-trip; the schema agrees with the loader and the limits; a
repro written from a failing run reproduces it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from kvcheck.replay import replay, resolve_target
from kvcheck.repro import failing_trace, write_repro
from kvcheck.trace import FORMAT, SCHEMA_PATH, VERSION, Expectation, Trace, TraceError, load_trace, parse_trace
from kvmodel import limits
from kvmodel.config import TargetConfig
from kvmodel.config_checks import ConfigError
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import GROUP_KINDS
from kvmodel.ops import (
    OPERATION_TYPES,
    OPTIONAL_FIELDS,
    AddRequest,
    EvictBlocks,
    FailedLoad,
    Finish,
    Preempt,
    ResetPrefixCache,
    Schedule,
)

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "regressions" / "traces"
CORPUS_PATHS = sorted(CORPUS.glob("*.json"))
S000 = CORPUS / "s000_fifo_reuse_when_caching_off.json"
S003 = CORPUS / "s003_cross_group_double_allocation.json"
REQUIRED_TOP_LEVEL = ("format", "version", "config", "ops")
CONFIG_KEYS = ("num_blocks", "block_size", "enable_caching", "groups")


def base_document() -> dict[str, Any]:
    """A fresh copy of a valid trace: add_request r0, schedule r0, finish r0 on three blocks."""
    document: dict[str, Any] = json.loads(S000.read_text())
    return document


def mutated(change: Callable[[dict[str, Any]], object]) -> str:
    """The base trace as JSON text after ``change`` edits its document in place."""
    document = base_document()
    change(document)
    return json.dumps(document, indent=2)


def schedule(request_id: str) -> dict[str, Any]:
    """The JSON of a one-token schedule of ``request_id``."""
    return {
        "op": "schedule",
        "request_id": request_id,
        "num_new_tokens": 1,
        "num_external_tokens": 0,
        "sampled_token": 0,
    }


@attrs.frozen
class Malformed:
    """A malformed trace text and where the loader must say it is wrong."""

    name: str
    text: str
    step: int | None
    field: str | None


# Steps count operations from 1, as replay, `kvcheck show` and invariant violations do.
MALFORMED = [
    Malformed("truncated_json", S000.read_text()[:120], None, None),
    Malformed("top_level_list", json.dumps([base_document()]), None, "(top level)"),
    Malformed("unknown_format", mutated(lambda d: d.update(format="kvcheck-log")), None, "format"),
    Malformed("version_2", mutated(lambda d: d.update(version=2)), None, "version"),
    Malformed("version_true", mutated(lambda d: d.update(version=True)), None, "version"),
    Malformed("missing_ops", mutated(lambda d: d.pop("ops")), None, "ops"),
    Malformed("unknown_top_level_field", mutated(lambda d: d.update(comment="hi")), None, "comment"),
    Malformed("num_blocks_string", mutated(lambda d: d["config"].update(num_blocks="8")), None, "config.num_blocks"),
    Malformed(
        "group_kind_unknown",
        mutated(lambda d: d["config"]["groups"][0].update(kind="global")),
        None,
        "config.groups[0].kind",
    ),
    Malformed(
        "sliding_window_without_window",
        mutated(lambda d: d["config"]["groups"][0].update(kind="sliding_window")),
        None,
        "config.groups[0].window",
    ),
    Malformed("unknown_operation", mutated(lambda d: d["ops"].append({"op": "compact"})), 4, "op"),
    Malformed("operation_name_not_a_string", mutated(lambda d: d["ops"][0].update(op=["add_request"])), 1, "op"),
    Malformed("num_new_tokens_string", mutated(lambda d: d["ops"][1].update(num_new_tokens="4")), 2, "num_new_tokens"),
    Malformed("prompt_holds_bool", mutated(lambda d: d["ops"][0].update(prompt=[0, True])), 1, "prompt[1]"),
    Malformed("prompt_is_string", mutated(lambda d: d["ops"][0].update(prompt="0 1 2")), 1, "prompt"),
    Malformed("op_field_missing", mutated(lambda d: d["ops"][1].pop("sampled_token")), 2, "sampled_token"),
    Malformed("op_field_unknown", mutated(lambda d: d["ops"][2].update(reason="done")), 3, "reason"),
    Malformed("unknown_request", mutated(lambda d: d["ops"].insert(1, schedule("r9"))), 2, "request_id"),
    Malformed("request_used_after_finish", mutated(lambda d: d["ops"].append(schedule("r0"))), 4, "request_id"),
    Malformed("request_added_twice", mutated(lambda d: d["ops"].insert(1, d["ops"][0])), 2, "request_id"),
    Malformed(
        "evict_block_outside_pool",
        mutated(lambda d: d["ops"].append({"op": "evict_blocks", "block_ids": [1, 3]})),
        4,
        "block_ids[1]",
    ),
]


def write_malformed(case: Malformed, folder: Path) -> Path:
    path = folder / f"{case.name}.json"
    path.write_text(case.text)
    return path


@pytest.mark.parametrize("case", MALFORMED, ids=[case.name for case in MALFORMED])
def test_malformed_trace_is_refused_naming_file_step_and_field(case: Malformed, tmp_path: Path) -> None:
    """A malformed trace raises TraceError whose attributes and text name the file, the step and the field."""
    path = write_malformed(case, tmp_path)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    error = caught.value
    assert error.where == str(path), f"{case.name}: where={error.where!r}"
    assert error.step == case.step, f"{case.name}: step={error.step!r} expected {case.step!r} ({error})"
    assert error.field == case.field, f"{case.name}: field={error.field!r} expected {case.field!r} ({error})"
    text = str(error)
    assert text.startswith(f"{path}: "), f"{case.name}: {text!r}"
    if case.step is not None:
        assert f"step {case.step}" in text, f"{case.name}: {text!r}"
    if case.field is not None:
        assert f"field '{case.field}'" in text, f"{case.name}: {text!r}"


def test_a_missing_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Loading a file that does not exist raises TraceError naming the file, not OSError."""
    path = tmp_path / "absent.json"
    with pytest.raises(TraceError, match="cannot read") as caught:
        load_trace(path)
    assert caught.value.where == str(path)


def test_a_file_that_is_not_utf8_is_refused_as_a_trace_error(tmp_path: Path) -> None:
    """A file whose bytes are not UTF-8 text raises TraceError naming the file."""
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(TraceError):
        load_trace(path)


# -- input limits ---------------------------------------------------------------------


def add_request(request_id: str, num_tokens: int, token: int = 0) -> dict[str, Any]:
    """The JSON of an add_request of ``num_tokens`` copies of ``token``."""
    return {"op": "add_request", "request_id": request_id, "prompt": [token] * num_tokens}


def renamed_request(document: dict[str, Any], request_id: str) -> None:
    """Rename request r0 of the base trace in every operation."""
    for op in document["ops"]:
        op["request_id"] = request_id


def more_prompts(document: dict[str, Any], count: int, num_tokens: int) -> None:
    """Append ``count`` add_requests of ``num_tokens`` tokens each to the base trace."""
    document["ops"] += [add_request(f"p{i}", num_tokens) for i in range(count)]


def padded_ops(document: dict[str, Any], num_ops: int) -> None:
    """Pad the base trace with reset_prefix_cache operations to ``num_ops`` operations."""
    document["ops"] += [{"op": "reset_prefix_cache"}] * (num_ops - len(document["ops"]))


def prompts_filling_the_budget(document: dict[str, Any]) -> None:
    """Append prompts that bring the base trace (one one-token prompt) to exactly the trace's prompt budget."""
    budget = limits.MAX_TRACE_PROMPT_TOKENS - 1
    more_prompts(document, budget // limits.MAX_PROMPT_TOKENS, limits.MAX_PROMPT_TOKENS)
    if budget % limits.MAX_PROMPT_TOKENS:
        document["ops"].append(add_request("rest", budget % limits.MAX_PROMPT_TOKENS))


def set_op(step: int, **fields: object) -> Callable[[dict[str, Any]], None]:
    """A change that sets fields of the operation at ``step`` (from 1) of the base trace."""
    return lambda d: d["ops"][step - 1].update(fields)


def set_config(**fields: object) -> Callable[[dict[str, Any]], None]:
    """A change that sets fields of the base trace's config."""
    return lambda d: d["config"].update(fields)


def evict(block_ids: list[int], num_blocks: int = 3) -> Callable[[dict[str, Any]], None]:
    """A change that sets the pool size and appends an evict_blocks of ``block_ids``."""

    def change(document: dict[str, Any]) -> None:
        document["config"]["num_blocks"] = num_blocks
        document["ops"].append({"op": "evict_blocks", "block_ids": block_ids})

    return change


@attrs.frozen
class OverLimit:
    """A trace with one value beyond its limit, where the loader must refuse it, and the value and limit it names."""

    name: str
    change: Callable[[dict[str, Any]], object]
    step: int | None
    field: str
    message: str


OVER_LIMIT = [
    OverLimit(
        "num_blocks",
        set_config(num_blocks=limits.MAX_NUM_BLOCKS + 1),
        None,
        "config.num_blocks",
        f"{limits.MAX_NUM_BLOCKS + 1} is above the limit of {limits.MAX_NUM_BLOCKS}",
    ),
    OverLimit(
        "block_size",
        set_config(block_size=limits.MAX_BLOCK_SIZE + 1),
        None,
        "config.block_size",
        f"{limits.MAX_BLOCK_SIZE + 1} is above the limit of {limits.MAX_BLOCK_SIZE}",
    ),
    OverLimit(
        "groups",
        set_config(groups=[{"kind": "full"}] * (limits.MAX_GROUPS + 1)),
        None,
        "config.groups",
        f"{limits.MAX_GROUPS + 1} groups is above the limit of {limits.MAX_GROUPS}",
    ),
    OverLimit(
        "window",
        set_config(groups=[{"kind": "sliding_window", "window": limits.MAX_WINDOW_TOKENS + 1}]),
        None,
        "config.groups[0].window",
        f"{limits.MAX_WINDOW_TOKENS + 1} tokens is above the limit of {limits.MAX_WINDOW_TOKENS}",
    ),
    OverLimit(
        "ops",
        lambda d: padded_ops(d, limits.MAX_OPS + 1),
        None,
        "ops",
        f"{limits.MAX_OPS + 1} operations is above the limit of {limits.MAX_OPS}",
    ),
    OverLimit(
        "prompt",
        set_op(1, prompt=[0] * (limits.MAX_PROMPT_TOKENS + 1)),
        1,
        "prompt",
        f"{limits.MAX_PROMPT_TOKENS + 1} tokens is above the limit of {limits.MAX_PROMPT_TOKENS}",
    ),
    OverLimit(
        "prompts_of_the_trace",
        lambda d: more_prompts(d, limits.MAX_TRACE_PROMPT_TOKENS // limits.MAX_PROMPT_TOKENS, limits.MAX_PROMPT_TOKENS),
        3 + limits.MAX_TRACE_PROMPT_TOKENS // limits.MAX_PROMPT_TOKENS,
        "prompt",
        f"{limits.MAX_TRACE_PROMPT_TOKENS + 1} tokens, above the limit of {limits.MAX_TRACE_PROMPT_TOKENS}",
    ),
    OverLimit(
        "prompt_token_id",
        set_op(1, prompt=[limits.MAX_TOKEN_ID + 1]),
        1,
        "prompt[0]",
        f"{limits.MAX_TOKEN_ID + 1} is above the limit of {limits.MAX_TOKEN_ID}",
    ),
    OverLimit(
        "sampled_token",
        set_op(2, sampled_token=limits.MAX_TOKEN_ID + 1),
        2,
        "sampled_token",
        f"{limits.MAX_TOKEN_ID + 1} is above the limit of {limits.MAX_TOKEN_ID}",
    ),
    OverLimit(
        "num_new_tokens",
        set_op(2, num_new_tokens=limits.MAX_SCHEDULE_TOKENS + 1),
        2,
        "num_new_tokens",
        f"{limits.MAX_SCHEDULE_TOKENS + 1} is above the limit of {limits.MAX_SCHEDULE_TOKENS}",
    ),
    OverLimit(
        "num_external_tokens",
        set_op(2, num_external_tokens=10**12),
        2,
        "num_external_tokens",
        f"1000000000000 is above the limit of {limits.MAX_SCHEDULE_TOKENS}",
    ),
    OverLimit(
        "evict_block_ids",
        evict([*range(limits.MAX_NUM_BLOCKS), 0], limits.MAX_NUM_BLOCKS),
        4,
        "block_ids",
        f"{limits.MAX_EVICT_BLOCK_IDS + 1} block ids is above the limit of {limits.MAX_EVICT_BLOCK_IDS}",
    ),
    OverLimit(
        "evict_block_id",
        evict([1, 10**100]),
        4,
        "block_ids[1]",
        f"(101 digits) is above the limit of {limits.MAX_NUM_BLOCKS - 1}",
    ),
    OverLimit(
        "request_id",
        lambda d: renamed_request(d, "r" * (limits.MAX_REQUEST_ID_CHARS + 1)),
        1,
        "request_id",
        f"{limits.MAX_REQUEST_ID_CHARS + 1} characters is above the limit of {limits.MAX_REQUEST_ID_CHARS}",
    ),
]


@pytest.mark.parametrize("case", OVER_LIMIT, ids=[case.name for case in OVER_LIMIT])
def test_a_value_above_its_limit_is_refused_naming_field_value_and_limit(case: OverLimit) -> None:
    """A trace with one value beyond its limit raises TraceError naming the step, the field, the value and the limit."""
    with pytest.raises(TraceError) as caught:
        parse_trace(mutated(case.change), "bad.json")
    error = caught.value
    assert (error.step, error.field) == (case.step, case.field), str(error)
    assert case.message in error.message, str(error)
    assert "\n" not in str(error), str(error)


def test_the_message_of_a_pool_above_the_limit_reads_as_documented() -> None:
    """A pool of 10**12 blocks is refused with the one-line message the README shows."""
    with pytest.raises(TraceError) as caught:
        parse_trace(mutated(set_config(num_blocks=10**12)), "bad.json")
    assert str(caught.value) == (
        f"bad.json: field 'config.num_blocks': 1000000000000 is above the limit of {limits.MAX_NUM_BLOCKS}"
    )


AT_LIMIT = {
    "num_blocks": set_config(num_blocks=limits.MAX_NUM_BLOCKS),
    "block_size": set_config(block_size=limits.MAX_BLOCK_SIZE),
    "groups": set_config(groups=[{"kind": "full"}] * limits.MAX_GROUPS),
    "window": set_config(groups=[{"kind": "sliding_window", "window": limits.MAX_WINDOW_TOKENS}]),
    "ops": lambda d: padded_ops(d, limits.MAX_OPS),
    "prompt": set_op(1, prompt=[limits.MAX_TOKEN_ID] * limits.MAX_PROMPT_TOKENS),
    "prompts_of_the_trace": prompts_filling_the_budget,
    "schedule": set_op(
        2,
        num_new_tokens=limits.MAX_SCHEDULE_TOKENS,
        num_external_tokens=limits.MAX_SCHEDULE_TOKENS,
        sampled_token=limits.MAX_TOKEN_ID,
    ),
    "evict_block_ids": evict([*range(limits.MAX_NUM_BLOCKS)], limits.MAX_NUM_BLOCKS),
    "request_id": lambda d: renamed_request(d, "r" * limits.MAX_REQUEST_ID_CHARS),
}


@pytest.mark.parametrize("change", AT_LIMIT.values(), ids=AT_LIMIT.keys())
def test_a_value_at_its_limit_is_accepted(change: Callable[[dict[str, Any]], object]) -> None:
    """Every limit is inclusive: a trace whose value equals the limit loads, its config and operations intact."""
    text = mutated(change)
    document = json.loads(text)
    loaded = parse_trace(text).to_json()
    assert (loaded["config"], loaded["ops"]) == (document["config"], document["ops"])


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (
            TargetConfig(
                num_blocks=limits.MAX_NUM_BLOCKS + 1,
                block_size=1,
                groups=(GroupSpec(kind="full"),),
                enable_caching=True,
            ),
            "num_blocks",
        ),
        (
            TargetConfig(
                num_blocks=4,
                block_size=limits.MAX_BLOCK_SIZE + 1,
                groups=(GroupSpec(kind="full"),),
                enable_caching=True,
            ),
            "block_size",
        ),
        (
            TargetConfig(
                num_blocks=4,
                block_size=1,
                groups=(GroupSpec(kind="full"),) * (limits.MAX_GROUPS + 1),
                enable_caching=True,
            ),
            "groups",
        ),
        (
            TargetConfig(
                num_blocks=4,
                block_size=1,
                groups=(GroupSpec(kind="chunked_local", window=limits.MAX_WINDOW_TOKENS + 1),),
                enable_caching=True,
            ),
            "groups[0].window",
        ),
    ],
    ids=["num_blocks", "block_size", "groups", "window"],
)
def test_the_configuration_check_applies_the_same_limits(config: TargetConfig, field: str) -> None:
    """TargetConfig.validate, which every driver runs, refuses a configuration beyond a limit, naming the field."""
    with pytest.raises(ConfigError) as caught:
        config.validate()
    assert caught.value.field == field
    assert "is above the limit of" in caught.value.detail


def test_a_file_above_the_size_limit_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file larger than the limit is refused by its size, naming the size and the limit, without being opened."""
    path = tmp_path / "huge.json"
    with path.open("wb") as stream:
        stream.truncate(10 * limits.MAX_TRACE_BYTES)  # sparse: no disk space, and never read

    def refuse_to_open(*args: object, **kwargs: object) -> None:
        raise AssertionError("the loader opened a file above the size limit")

    monkeypatch.setattr(Path, "open", refuse_to_open)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert caught.value.where == str(path)
    assert f"{10 * limits.MAX_TRACE_BYTES} bytes is above the limit of {limits.MAX_TRACE_BYTES}" in caught.value.message


def test_a_file_at_the_size_limit_is_read(tmp_path: Path) -> None:
    """A valid trace padded with whitespace to exactly the size limit loads."""
    text = S000.read_text()
    path = tmp_path / "padded.json"
    path.write_bytes(text.encode() + b" " * (limits.MAX_TRACE_BYTES - len(text.encode())))
    assert load_trace(path) == load_trace(S000)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("nested_lists", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("nested_objects", '{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
        ("number_of_5000_digits", '{"format": ' + "7" * 5000 + "}", "not valid JSON"),
        ("byte_order_mark", "\ufeff" + S000.read_text(), "not valid JSON"),
    ],
    ids=["nested_lists", "nested_objects", "number_of_5000_digits", "byte_order_mark"],
)
def test_json_that_python_cannot_read_is_a_trace_error(name: str, text: str, message: str) -> None:
    """Deep nesting, a number too long to convert and a byte-order mark raise TraceError, not a Python error."""
    with pytest.raises(TraceError, match=message):
        parse_trace(text, name)


# -- round trip --------------------------------------------------------------------


EVERY_OPERATION = Trace(
    TargetConfig(
        num_blocks=6,
        block_size=2,
        groups=(GroupSpec(kind="full"), GroupSpec(kind="sliding_window", window=4)),
        enable_caching=True,
    ),
    (
        AddRequest("r0", (1, 2, 3)),
        Schedule("r0", 3, 0, 7),
        FailedLoad("r0"),
        Preempt("r0"),
        Finish("r0"),
        EvictBlocks((1, 5)),
        ResetPrefixCache(),
    ),
    Expectation("no_duplicate_block_ids", None),
)


@pytest.mark.parametrize("path", CORPUS_PATHS, ids=[p.stem for p in CORPUS_PATHS])
def test_a_corpus_trace_survives_dumps_and_parse(path: Path) -> None:
    """Dumping a corpus trace and parsing the text back gives an equal trace."""
    trace = load_trace(path)
    assert parse_trace(trace.dumps(), path.name) == trace


@pytest.mark.parametrize(
    "trace",
    [EVERY_OPERATION, attrs.evolve(EVERY_OPERATION, expect=None)],
    ids=["every_operation", "no_expectation"],
)
def test_every_operation_kind_survives_dumps_and_parse(trace: Trace) -> None:
    """A trace using every operation kind, with or without an expectation, round-trips through its text."""
    assert parse_trace(trace.dumps()) == trace


def test_the_corpus_holds_the_two_seed_traces() -> None:
    """Both seed traces the CLI tests rely on are in the corpus."""
    assert S000 in CORPUS_PATHS, CORPUS_PATHS
    assert S003 in CORPUS_PATHS, CORPUS_PATHS


# -- the schema agrees with the loader ------------------------------------------------

SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
OP_SCHEMAS: list[dict[str, Any]] = SCHEMA["properties"]["ops"]["items"]["oneOf"]


def schema_op_names(op_schema: dict[str, Any]) -> list[str]:
    name = op_schema["properties"]["op"]
    return [name["const"]] if "const" in name else list(name["enum"])


def test_schema_pins_the_format_and_version_the_loader_reads() -> None:
    """The schema's format and version constants are the loader's."""
    assert SCHEMA["properties"]["format"]["const"] == FORMAT
    assert SCHEMA["properties"]["version"]["const"] == VERSION


def test_schema_requires_the_top_level_keys_the_loader_requires() -> None:
    """The schema's required top-level keys are format, version, config and ops, as the loader's."""
    assert SCHEMA["required"] == list(REQUIRED_TOP_LEVEL)
    assert SCHEMA["additionalProperties"] is False


@pytest.mark.parametrize("key", REQUIRED_TOP_LEVEL)
def test_the_loader_refuses_a_trace_without_a_required_top_level_key(key: str) -> None:
    """Dropping a key the schema requires makes the loader report that key as missing."""
    with pytest.raises(TraceError) as caught:
        parse_trace(mutated(lambda d: d.pop(key)))
    assert (caught.value.field, caught.value.message) == (key, "missing")


@pytest.mark.parametrize("key", sorted(set(SCHEMA["properties"]) - set(REQUIRED_TOP_LEVEL)))
def test_the_loader_accepts_a_trace_without_an_optional_top_level_key(key: str) -> None:
    """Every top-level key the schema leaves optional may be left out."""
    assert parse_trace(mutated(lambda d: d.pop(key))) is not None


@pytest.mark.parametrize("key", CONFIG_KEYS)
def test_the_loader_refuses_a_config_without_a_key_the_schema_requires(key: str) -> None:
    """The schema's required config keys are the loader's: dropping one is reported as config.KEY missing."""
    assert key in SCHEMA["properties"]["config"]["required"]
    with pytest.raises(TraceError) as caught:
        parse_trace(mutated(lambda d: d["config"].pop(key)))
    assert (caught.value.field, caught.value.message) == (f"config.{key}", "missing")


def test_schema_group_kinds_are_the_config_group_kinds() -> None:
    """The schema's group kinds are exactly the kinds the configuration accepts."""
    kinds = SCHEMA["properties"]["config"]["properties"]["groups"]["items"]["properties"]["kind"]["enum"]
    assert sorted(kinds) == sorted(GROUP_KINDS)


def test_schema_operation_names_are_the_operation_types() -> None:
    """The operation names the schema allows are exactly the keys of OPERATION_TYPES."""
    names = [name for op_schema in OP_SCHEMAS for name in schema_op_names(op_schema)]
    assert sorted(names) == sorted(OPERATION_TYPES), f"schema={sorted(names)} ops={sorted(OPERATION_TYPES)}"


@pytest.mark.parametrize(
    "op_schema", OP_SCHEMAS, ids=["/".join(schema_op_names(op_schema)) for op_schema in OP_SCHEMAS]
)
def test_schema_operation_fields_are_the_operation_attributes(op_schema: dict[str, Any]) -> None:
    """Each operation's fields in the schema are its attributes plus ``op``, and nothing more; all are
    required but the optional ones (``same_step``)."""
    for name in schema_op_names(op_schema):
        attributes = {a.name for a in attrs.fields(OPERATION_TYPES[name])}
        assert set(op_schema["required"]) == attributes - OPTIONAL_FIELDS.keys() | {"op"}, name
        assert set(op_schema["properties"]) == attributes | {"op"}, name
        assert op_schema["additionalProperties"] is False, name


def op_schema_named(name: str) -> dict[str, Any]:
    return next(op_schema for op_schema in OP_SCHEMAS if name in schema_op_names(op_schema))


def test_schema_maxima_are_the_limits_the_loader_applies() -> None:
    """Each maximum, maxItems and maxLength in the schema equals its constant in kvmodel.limits."""
    config = SCHEMA["properties"]["config"]["properties"]
    add, schedule_op, evict_op = (op_schema_named(n)["properties"] for n in ("add_request", "schedule", "evict_blocks"))
    pairs = {
        "config.num_blocks": (config["num_blocks"]["maximum"], limits.MAX_NUM_BLOCKS),
        "config.block_size": (config["block_size"]["maximum"], limits.MAX_BLOCK_SIZE),
        "config.groups": (config["groups"]["maxItems"], limits.MAX_GROUPS),
        "config.dcp_world_size": (config["dcp_world_size"]["maximum"], limits.MAX_DCP_WORLD_SIZE),
        "window": (config["groups"]["items"]["properties"]["window"]["maximum"], limits.MAX_WINDOW_TOKENS),
        "config.num_lookahead_tokens": (config["num_lookahead_tokens"]["maximum"], limits.MAX_LOOKAHEAD_TOKENS),
        "config.num_hash_lookahead_tokens": (
            config["num_hash_lookahead_tokens"]["maximum"],
            limits.MAX_LOOKAHEAD_TOKENS,
        ),
        "config.num_prefill_lookahead": (config["num_prefill_lookahead"]["maximum"], limits.MAX_LOOKAHEAD_TOKENS),
        "config.eagle_group_ids": (config["eagle_group_ids"]["maxItems"], limits.MAX_GROUPS),
        "config.max_in_flight_tokens": (config["max_in_flight_tokens"]["maximum"], limits.MAX_SCHEDULE_TOKENS),
        "config.reserved_blocks": (config["reserved_blocks"]["maximum"], limits.MAX_NUM_BLOCKS),
        "config.eagle_group_ids[i]": (config["eagle_group_ids"]["items"]["maximum"], limits.MAX_GROUPS - 1),
        "ops": (SCHEMA["properties"]["ops"]["maxItems"], limits.MAX_OPS),
        "prompt": (add["prompt"]["maxItems"], limits.MAX_PROMPT_TOKENS),
        "prompt[i]": (add["prompt"]["items"]["maximum"], limits.MAX_TOKEN_ID),
        "num_new_tokens": (schedule_op["num_new_tokens"]["maximum"], limits.MAX_SCHEDULE_TOKENS),
        "num_external_tokens": (schedule_op["num_external_tokens"]["maximum"], limits.MAX_SCHEDULE_TOKENS),
        "sampled_token": (schedule_op["sampled_token"]["maximum"], limits.MAX_TOKEN_ID),
        "block_ids": (evict_op["block_ids"]["maxItems"], limits.MAX_EVICT_BLOCK_IDS),
        "block_ids[i]": (evict_op["block_ids"]["items"]["maximum"], limits.MAX_NUM_BLOCKS - 1),
        "file size": (SCHEMA["x-kvcheck-limits"]["max_file_bytes"], limits.MAX_TRACE_BYTES),
        "prompt tokens per trace": (
            SCHEMA["x-kvcheck-limits"]["max_prompt_tokens_per_trace"],
            limits.MAX_TRACE_PROMPT_TOKENS,
        ),
    }
    for op_schema in OP_SCHEMAS:
        if "request_id" in op_schema["properties"]:
            name = "/".join(schema_op_names(op_schema))
            pairs[f"{name}.request_id"] = (
                op_schema["properties"]["request_id"]["maxLength"],
                limits.MAX_REQUEST_ID_CHARS,
            )
    drifted = {field: pair for field, pair in pairs.items() if pair[0] != pair[1]}
    assert not drifted, f"schema value != kvmodel.limits constant: {drifted}"


def bounded_nodes(node: object, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every integer, array and string node of the schema that operations or the config hold, with its path."""
    found = []
    if isinstance(node, dict):
        if node.get("type") in ("integer", "array") or (node.get("type") == "string" and path.endswith("request_id")):
            found.append((path, node))
        for key, value in node.items():
            found += bounded_nodes(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += bounded_nodes(value, f"{path}/{index}")
    return found


def test_every_number_list_and_request_id_in_the_schema_is_bounded() -> None:
    """No integer, list or request id in the schema is left without an upper bound."""
    nodes = bounded_nodes(SCHEMA)
    assert len(nodes) >= 15, nodes
    unbounded = [
        path for path, node in nodes if not {"maximum", "maxItems", "maxLength"} & node.keys() and "const" not in node
    ]
    assert not unbounded, unbounded


@pytest.mark.parametrize("path", CORPUS_PATHS, ids=[p.stem for p in CORPUS_PATHS])
def test_a_corpus_trace_uses_only_keys_the_schema_names(path: Path) -> None:
    """Every key in a corpus file, at the top, in its config, groups and ops, is one the schema names."""
    document = json.loads(path.read_text())
    properties = SCHEMA["properties"]
    assert set(document) <= set(properties), path.name
    assert set(properties["config"]["required"]) <= set(document["config"]), path.name
    assert set(document["config"]) <= set(properties["config"]["properties"]), path.name
    group_keys = set(properties["config"]["properties"]["groups"]["items"]["properties"])
    for group in document["config"]["groups"]:
        assert set(group) <= group_keys, f"{path.name}: {group}"
    by_name = {name: op_schema for op_schema in OP_SCHEMAS for name in schema_op_names(op_schema)}
    for step, op in enumerate(document["ops"]):
        assert op["op"] in by_name, f"{path.name} step {step}: {op}"
        schema = by_name[op["op"]]
        assert set(schema["required"]) <= set(op) <= set(schema["properties"]), f"{path.name} step {step}: {op}"


# -- repro files ----------------------------------------------------------------------


def run_standalone(py_path: Path) -> subprocess.CompletedProcess[str]:
    """Run a standalone repro file alone, as a person would, from the checkout."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(py_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def s003_failing_trace() -> Trace:
    """The s003 trace as the harness writes it after a failing run under interleaved-external-alloc."""
    trace = load_trace(S003)
    fault = "interleaved-external-alloc"
    outcome = replay(trace, resolve_target("kvcore", fault))
    assert outcome.violation is not None, "s003 no longer fails under its fault"
    return failing_trace(trace.config, list(trace.ops), outcome.violation, fault, "test_trace_format")


def test_write_repro_writes_a_trace_that_loads_back_equal(s003_failing_trace: Trace, tmp_path: Path) -> None:
    """The JSON file write_repro writes loads back as the same trace, and the test file sits beside it."""
    json_path, py_path = write_repro(s003_failing_trace, tmp_path, "s003 double/allocation")
    assert json_path == tmp_path / "s003_double_allocation.json"
    assert py_path == tmp_path / "test_s003_double_allocation.py"
    assert load_trace(json_path) == s003_failing_trace
    assert py_path.is_file()


def test_the_standalone_repro_fails_with_the_invariant_under_its_fault(
    s003_failing_trace: Trace, tmp_path: Path
) -> None:
    """Run alone, the standalone test of a fault-tagged trace fails, naming the violated invariant."""
    _, py_path = write_repro(s003_failing_trace, tmp_path, "s003")
    result = run_standalone(py_path)
    assert result.returncode == 1, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "no_duplicate_block_ids" in result.stdout, result.stdout


def test_the_standalone_repro_passes_once_the_fault_is_gone(s003_failing_trace: Trace, tmp_path: Path) -> None:
    """The same trace tagged with no fault replays on plain kvcore, so the standalone test passes."""
    assert s003_failing_trace.expect is not None
    untagged = attrs.evolve(s003_failing_trace, expect=attrs.evolve(s003_failing_trace.expect, fault=None))
    _, py_path = write_repro(untagged, tmp_path, "s003_fixed")
    result = run_standalone(py_path)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"


def test_same_step_round_trips_and_is_left_out_when_off() -> None:
    """A schedule joining the step before it writes ``same_step: true`` and loads back equal; one that
    starts its own step writes no such field, so older traces read the same."""
    config = TargetConfig(
        num_blocks=8, block_size=2, groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")), enable_caching=True
    )
    ops = (AddRequest("r0", (0, 1, 2)), Schedule("r0", 2), Schedule("r0", 1, same_step=True))
    text = Trace(config, ops).dumps()
    assert parse_trace(text, "same_step.json").ops == ops
    assert text.count('"same_step": true') == 1 and "false" not in text


@pytest.mark.parametrize(
    ("value", "async_scheduling", "message"),
    [
        ("yes", False, "expected true or false, got 'yes'"),
        (1, False, "expected true or false, got 1"),
        (True, True, "true with async scheduling"),
    ],
)
def test_a_bad_same_step_is_refused_naming_step_and_field(
    tmp_path: Path, value: object, async_scheduling: bool, message: str
) -> None:
    config = TargetConfig(
        num_blocks=8,
        block_size=2,
        groups=(GroupSpec(kind="full"),),
        enable_caching=True,
        async_scheduling=async_scheduling,
    )
    document = json.loads(Trace(config, (AddRequest("r0", (0, 1)), Schedule("r0", 1))).dumps())
    document["ops"][1]["same_step"] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(TraceError, match=rf"step 2: field 'same_step': {message}"):
        load_trace(path)


def test_use_eagle_round_trips_and_is_left_out_when_off() -> None:
    """A configuration serving an EAGLE drafter writes ``use_eagle: true`` and loads back equal; one
    without writes no such field, so older traces read the same."""
    eagle = TargetConfig(
        num_blocks=8,
        block_size=2,
        groups=(GroupSpec(kind="full"), GroupSpec(kind="sliding_window", window=4)),
        enable_caching=True,
        use_eagle=True,
    )
    trace = Trace(eagle, (AddRequest("r0", (0, 1)),))
    assert parse_trace(trace.dumps(), "eagle.json").config == eagle
    assert (
        "use_eagle"
        not in TargetConfig(num_blocks=8, block_size=2, groups=(GroupSpec(kind="full"),), enable_caching=True).to_json()
    )


def test_use_eagle_beside_a_chunked_local_group_is_refused_naming_the_field(tmp_path: Path) -> None:
    """With caching on, a drafter beside a chunked-local group is refused (vLLM asserts on it), exit 2."""
    document = {
        "format": "kvcheck-trace",
        "version": 1,
        "config": {
            "num_blocks": 8,
            "block_size": 2,
            "enable_caching": True,
            "use_eagle": True,
            "groups": [{"kind": "full"}, {"kind": "chunked_local", "window": 4}],
        },
        "ops": [{"op": "add_request", "request_id": "r0", "prompt": [0]}],
    }
    path = tmp_path / "eagle_chunked.json"
    path.write_text(json.dumps(document))
    with pytest.raises(TraceError, match=r"field 'config.use_eagle'.*chunked_local"):
        load_trace(path)


def test_num_lookahead_tokens_round_trips_and_is_refused_above_its_limit(tmp_path: Path) -> None:
    """Lookahead slots are written when set, load back equal, and a value above the limit is refused
    naming the field, the value and the limit."""
    config = TargetConfig(
        num_blocks=8, block_size=2, groups=(GroupSpec(kind="full"),), enable_caching=True, num_lookahead_tokens=3
    )
    assert parse_trace(Trace(config, (AddRequest("r0", (0,)),)).dumps(), "la.json").config == config
    document = json.loads(Trace(config, (AddRequest("r0", (0,)),)).dumps())
    document["config"]["num_lookahead_tokens"] = limits.MAX_LOOKAHEAD_TOKENS + 1
    path = tmp_path / "lookahead.json"
    path.write_text(json.dumps(document))
    with pytest.raises(
        TraceError, match=rf"config.num_lookahead_tokens'.*above the limit of {limits.MAX_LOOKAHEAD_TOKENS}"
    ):
        load_trace(path)


def test_drafter_and_async_fields_round_trip() -> None:
    """Drafter groups, hash and prefill lookahead, async scheduling, deferred frees, admission gates
    and KV cache events are written when set and load back equal."""
    config = TargetConfig(
        num_blocks=8,
        block_size=2,
        groups=(GroupSpec(kind="full"), GroupSpec(kind="sliding_window", window=3)),
        enable_caching=True,
        num_lookahead_tokens=2,
        async_scheduling=True,
        defer_block_free=True,
        num_hash_lookahead_tokens=1,
        num_prefill_lookahead=1,
        eagle_group_ids=(0,),
        reserve_full_sequence=True,
        max_in_flight_tokens=4,
        reserved_blocks=2,
        watermark=0.25,
        enable_kv_cache_events=True,
    )
    assert parse_trace(Trace(config, (AddRequest("r0", (0,)),)).dumps(), "d.json").config == config
    kinds = (
        GroupSpec(kind="full"),
        GroupSpec(kind="rswa", window=2),
        GroupSpec(kind="ring"),
        GroupSpec(kind="cross_attention"),
        GroupSpec(kind="mla"),
        GroupSpec(kind="mamba", speculative_blocks=2),
    )
    encoder_decoder = TargetConfig(num_blocks=8, block_size=2, groups=kinds, enable_caching=False, num_encoder_tokens=3)
    assert parse_trace(Trace(encoder_decoder, ()).dumps(), "e.json").config == encoder_decoder
    sizes = (GroupSpec(kind="full", block_size=4), GroupSpec(kind="sliding_window", window=3))
    mixed = TargetConfig(num_blocks=8, block_size=2, groups=sizes, enable_caching=True, hash_block_size=1)
    assert parse_trace(Trace(mixed, ()).dumps(), "m.json").config == mixed
    plain = json.loads(
        Trace(
            TargetConfig(num_blocks=8, block_size=2, groups=(GroupSpec(kind="full"),), enable_caching=True), ()
        ).dumps()
    )["config"]
    assert set(plain) == {"num_blocks", "block_size", "enable_caching", "groups"}


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"defer_block_free": True}, "config.defer_block_free", "needs async_scheduling"),
        ({"eagle_group_ids": [2]}, r"config.eagle_group_ids\[0\]", "must name one of the 2 groups, got 2"),
        ({"eagle_group_ids": [0, 0]}, "config.eagle_group_ids", "names a group twice"),
        ({"eagle_group_ids": 0}, "config.eagle_group_ids", "expected a list of group indices, got 0"),
        ({"use_eagle": True, "num_hash_lookahead_tokens": 1}, "config.num_hash_lookahead_tokens", "replace the EAGLE"),
        ({"use_eagle": True, "num_prefill_lookahead": 3}, "config.num_prefill_lookahead", "scheduler block size 2"),
        ({"num_prefill_lookahead": 65}, "config.num_prefill_lookahead", "above the limit of 64"),
        ({"async_scheduling": 1}, "config.async_scheduling", "must be true or false"),
        ({"enable_kv_cache_events": "yes"}, "config.enable_kv_cache_events", "must be true or false, got 'yes'"),
        (
            {"enable_mamba_shared_prefix_checkpoint": 1},
            "config.enable_mamba_shared_prefix_checkpoint",
            "must be true or false, got 1",
        ),
        ({"watermark": 1.5}, "config.watermark", "must be >= 0 and < 1, got 1.5"),
        ({"watermark": "high"}, "config.watermark", "must be a fraction of the pool"),
        ({"reserved_blocks": -1}, "config.reserved_blocks", "must be an integer >= 0, got -1"),
        ({"max_in_flight_tokens": 0}, "config.max_in_flight_tokens", "must be an integer >= 1, got 0"),
        ({"num_encoder_tokens": 3}, "config.num_encoder_tokens", "3 without a cross_attention group"),
        ({"num_encoder_tokens": "3"}, "config.num_encoder_tokens", "must be an integer >= 0, got '3'"),
        (
            {"groups": [{"kind": "full"}, {"kind": "cross_attention"}], "num_encoder_tokens": 2},
            "config.enable_caching",
            "cross_attention: its blocks have no prefix cache",
        ),
        (
            {"groups": [{"kind": "full"}, {"kind": "cross_attention"}], "enable_caching": False},
            "config.num_encoder_tokens",
            "needs the encoder's token count",
        ),
        ({"groups": [{"kind": "ring"}, {"kind": "ring"}]}, "config.enable_caching", "no group in the prefix cache"),
        ({"groups": [{"kind": "ring", "window": 2}]}, r"config.groups\[0\].window", "a ring group has no window"),
        ({"groups": [{"kind": "rswa", "window": 0}]}, r"config.groups\[0\].window", "at least 1 token, got 0"),
        ({"groups": [{"kind": "mamba"}]}, "config.enable_caching", "groups\\[0\\] mamba: its 'none' cache mode"),
        (
            {"groups": [{"kind": "mamba", "speculative_blocks": -1}], "enable_caching": False},
            r"config.groups\[0\].speculative_blocks",
            "must be an integer from 0 to 8, got -1",
        ),
        (
            {"groups": [{"kind": "mamba", "speculative_blocks": 9}], "enable_caching": False},
            r"config.groups\[0\].speculative_blocks",
            "from 0 to 8, got 9",
        ),
        (
            {"groups": [{"kind": "full", "speculative_blocks": 1}]},
            r"config.groups\[0\].speculative_blocks",
            "only a mamba or mamba_align group has speculative blocks, got 1",
        ),
        ({"groups": [{"kind": "mla", "window": 4}]}, r"config.groups\[0\].window", "a mla group has no window"),
        ({"groups": [{"kind": "full", "block_size": 0}]}, r"config.groups\[0\].block_size", ">= 1, got 0"),
        ({"groups": [{"kind": "full", "block_size": 2048}]}, r"config.groups\[0\].block_size", "limit of 1024"),
        ({"hash_block_size": "2"}, "config.hash_block_size", "must be an integer >= 1, got '2'"),
        ({"hash_block_size": 3}, "config.hash_block_size", "3 does not divide the scheduler block size 2"),
        (
            {
                "groups": [{"kind": "full", "block_size": 4}, {"kind": "sliding_window", "window": 3}],
                "hash_block_size": 4,
            },
            "config.hash_block_size",
            "4 does not divide groups\\[1\\]'s block_size 2",
        ),
        (
            {"groups": [{"kind": "full", "block_size": 4}, {"kind": "chunked_local", "window": 2}]},
            r"config.groups\[1\].block_size",
            "2 is not the hits. alignment 4",
        ),
        (
            {"groups": [{"kind": "full"}, {"kind": "ring", "block_size": 4}, {"kind": "sliding_window", "window": 3}]},
            r"config.groups\[1\].block_size",
            "enters the ring's scratch block in the prefix cache",
        ),
        ({"prefix_cache_retention_interval": -2}, "config.prefix_cache_retention_interval", ">= 0, got -2"),
        ({"prefix_cache_retention_interval": "4"}, "config.prefix_cache_retention_interval", ">= 0, got '4'"),
        (
            {"groups": [{"kind": "full"}], "prefix_cache_retention_interval": 4},
            "config.prefix_cache_retention_interval",
            "no sliding-window or Mamba group",
        ),
        (
            {"groups": [{"kind": "sliding_window", "window": 3}], "prefix_cache_retention_interval": 3},
            "config.prefix_cache_retention_interval",
            "3 is not a multiple of the scheduler block size 2",
        ),
        (
            {
                "groups": [{"kind": "full"}, {"kind": "mamba_align", "block_size": 4}],
                "use_eagle": True,
                "num_prefill_lookahead": 2,
            },
            "config.num_prefill_lookahead",
            r"2 with groups\[1\] mamba_align in blocks larger than the hashes holding the drafter: vLLM 0.33.0",
        ),
        (
            {"groups": [{"kind": "sliding_window", "window": 3}], "prefix_cache_retention_interval": 70000},
            "config.prefix_cache_retention_interval",
            "limit of 65536",
        ),
        ({"dcp_world_size": 0}, "config.dcp_world_size", "must be an integer >= 1, got 0"),
        ({"dcp_world_size": 17}, "config.dcp_world_size", "limit of 16"),
        (
            {"dcp_world_size": 2},
            "config.dcp_world_size",
            r"groups\[1\] sliding_window sharded: a hybrid cache shards only full-attention groups",
        ),
        (
            {"groups": [{"kind": "chunked_local", "window": 4}], "dcp_world_size": 2},
            "config.dcp_world_size",
            "one chunked_local group: vLLM 0.33.0 looks its hits up only unsharded",
        ),
        (
            {"groups": [{"kind": "full", "dcp_replicated": 1}]},
            r"config.groups\[0\].dcp_replicated",
            "must be true or false, got 1",
        ),
        (
            {"groups": [{"kind": "mamba", "dcp_replicated": True}], "enable_caching": False},
            r"config.groups\[0\].dcp_replicated",
            "a mamba group, whose state is never sharded",
        ),
        (
            {"groups": [{"kind": "full"}, {"kind": "full", "kv_cache_dtype": "fp16"}]},
            r"config.groups\[1\].kv_cache_dtype",
            "must be one of auto, fp8, got 'fp16'",
        ),
        (
            {"groups": [{"kind": "full"}, {"kind": "mamba_align", "kv_cache_dtype": "fp8"}]},
            r"config.groups\[1\].kv_cache_dtype",
            "fp8 for a mamba_align group, which holds states, not a KV cache",
        ),
        (
            {"groups": [{"kind": "full", "prefill_checkpoint_alignment": 1}]},
            r"config.groups\[0\].prefill_checkpoint_alignment",
            "only a mamba_align group has prefill checkpoints, got 1",
        ),
        (
            {"groups": [{"kind": "full"}, {"kind": "mamba_align", "prefill_checkpoint_alignment": 0}]},
            r"config.groups\[1\].prefill_checkpoint_alignment",
            "must be an integer from 1 to 1024 tokens, got 0",
        ),
        (
            {"groups": [{"kind": "full"}, {"kind": "mamba_align", "prefill_checkpoint_alignment": "1"}]},
            r"config.groups\[1\].prefill_checkpoint_alignment",
            "must be an integer from 1 to 1024 tokens, got '1'",
        ),
        (
            {
                "groups": [{"kind": "full"}, {"kind": "mamba_align", "prefill_checkpoint_alignment": 1}],
                "async_scheduling": True,
                "num_hash_lookahead_tokens": 1,
                "num_prefill_lookahead": 1,
            },
            r"config.groups\[1\].prefill_checkpoint_alignment",
            "with async scheduling and hashes that look ahead: vLLM 0.33.0",
        ),
        (
            {"groups": [{"kind": "sliding_window", "window": 3}, {"kind": "mamba_align"}], "dcp_world_size": 2},
            "config.dcp_world_size",
            r"2 with prefix caching and groups\[0\] sliding_window sharded",
        ),
        (
            {"groups": [{"kind": "full"}, {"kind": "mamba_align"}], "prefix_cache_retention_interval": 3},
            "config.prefix_cache_retention_interval",
            "3 is not a multiple of the scheduler block size 2",
        ),
        (
            {
                "groups": [{"kind": "full"}, {"kind": "mamba_align", "block_size": 4}],
                "use_eagle": True,
                "num_prefill_lookahead": 2,
            },
            "config.num_prefill_lookahead",
            r"2 with groups\[1\] mamba_align in blocks larger than the hashes holding the drafter: vLLM 0.33.0",
        ),
    ],
)
def test_a_bad_drafter_or_async_field_is_refused_by_name(
    tmp_path: Path, changes: dict[str, object], field: str, message: str
) -> None:
    document = json.loads(
        Trace(
            TargetConfig(
                num_blocks=8,
                block_size=2,
                groups=(GroupSpec(kind="full"), GroupSpec(kind="sliding_window", window=3)),
                enable_caching=True,
            ),
            (),
        ).dumps()
    )
    document["config"].update(changes)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(TraceError, match=rf"field '{field}'.*{message}"):
        load_trace(path)
