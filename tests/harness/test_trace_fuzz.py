"""Fuzzing `kvcheck replay` and `kvcheck show` with corpus traces mutated every way a file can be wrong.

Each corpus trace is mutated deterministically (one fixed seed): values of the wrong type, fields dropped
or added, huge and negative numbers, truncated text, bytes that are not UTF-8, deep nesting, lists turned
into objects, and combinations.  Whatever the file holds, the command exits 0, 1 or 2 without a traceback,
a refusal is one line naming the file, and a trace that is accepted stays within the input limits, so its
replay is bounded by construction.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from kvcheck.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_VIOLATION, main
from kvcheck.trace import TraceError, load_trace, parse_trace
from kvmodel import limits
from kvmodel.ops import AddRequest
from tests.harness.test_trace_format import CORPUS_PATHS, S000

SEED = 20261201
MUTATED_CASES = 288
"""Mutations in all, spread over the corpus traces in turn: a fixed count however large the corpus grows."""
SHOW_EVERY = 4
"""Every fourth case is also rendered with `kvcheck show`."""

JsonPath = tuple[str | int, ...]
"""Where a value sits in a JSON document: the keys and indexes leading to it."""


@attrs.frozen
class Case:
    """A file's bytes, and the mutation that made them."""

    name: str
    data: bytes


# -- walking and editing a JSON document --------------------------------------------------


def paths(node: object, path: JsonPath = ()) -> list[JsonPath]:
    """Every path below the root of a JSON document, parents before children."""
    found: list[JsonPath] = []
    children: list[tuple[str | int, object]] = []
    if isinstance(node, dict):
        children = list(node.items())
    elif isinstance(node, list):
        children = list(enumerate(node))
    for key, child in children:
        found.append((*path, key))
        found += paths(child, (*path, key))
    return found


def get(document: object, path: JsonPath) -> Any:
    for key in path:
        document = document[key]  # type: ignore[index]
    return document


def put(document: object, path: JsonPath, value: object) -> None:
    get(document, path[:-1])[path[-1]] = value


def int_paths(document: object) -> list[JsonPath]:
    return [p for p in paths(document) if type(get(document, p)) is int]


def dict_paths(document: object) -> list[JsonPath]:
    return [(), *(p for p in paths(document) if isinstance(get(document, p), dict))]


# -- mutations of a parsed document (edit it in place) ----------------------------------------

NEST = '"__nest__"'


def other_type(rng: random.Random, value: object) -> object:
    """A value of another JSON type than ``value``: int <-> str, list, null, bool, float, object."""
    choices: list[object] = [str(value)[:20], [value], None, True, False, 1.5, {}, {"x": value}, "", 0, -1, []]
    return rng.choice([c for c in choices if type(c) is not type(value)])


def swap_type(rng: random.Random, document: dict[str, Any]) -> None:
    path = rng.choice(paths(document))
    put(document, path, other_type(rng, get(document, path)))


def drop_field(rng: random.Random, document: dict[str, Any]) -> None:
    keyed = [p for p in paths(document) if isinstance(p[-1], str)]
    path = rng.choice(keyed)
    del get(document, path[:-1])[path[-1]]


def add_field(rng: random.Random, document: dict[str, Any]) -> None:
    key = rng.choice(["extra", "op", "prompt", "window", "num_blocks", "", "k" * 300])
    get(document, rng.choice(dict_paths(document)))[key] = rng.choice([1, "x", None, [], {}])


def huge_number(rng: random.Random, document: dict[str, Any]) -> None:
    value = rng.choice([10**12, 10**100, 2**31, 2**63, limits.MAX_NUM_BLOCKS + 1, -(10**12)])
    put(document, rng.choice(int_paths(document) or [("ops",)]), value)


def negative_number(rng: random.Random, document: dict[str, Any]) -> None:
    path = rng.choice(int_paths(document) or [("version",)])
    put(document, path, rng.choice([-1, -(2**31), -abs(get(document, path)) - 1]))


def long_string(rng: random.Random, document: dict[str, Any]) -> None:
    strings = [p for p in paths(document) if isinstance(get(document, p), str)]
    put(document, rng.choice(strings), "s" * rng.choice([limits.MAX_REQUEST_ID_CHARS + 1, 100_000]))


def long_list(rng: random.Random, document: dict[str, Any]) -> None:
    lists = [p for p in paths(document) if isinstance(get(document, p), list)] or [("ops",)]
    put(document, rng.choice(lists), [rng.choice([0, 1, "x", {}])] * rng.choice([513, 1001, 100_000]))


def deep_nesting(rng: random.Random, document: dict[str, Any]) -> None:
    """Mark a place for deeply nested lists or objects (filled in when the text is written)."""
    put(document, rng.choice(paths(document)), NEST[1:-1])


def list_as_object(rng: random.Random, document: dict[str, Any]) -> None:
    lists = [p for p in paths(document) if isinstance(get(document, p), list)]
    path = rng.choice([("ops",), *lists])
    put(document, path, {str(i): item for i, item in enumerate(get(document, path))})


def object_as_list(rng: random.Random, document: dict[str, Any]) -> None:
    path = rng.choice([p for p in dict_paths(document) if p])
    put(document, path, list(get(document, path).values()))


def rename_op(rng: random.Random, document: dict[str, Any]) -> None:
    names = ["add_request", "schedule", "finish", "preempt", "failed_load", "evict_blocks", "reset_prefix_cache"]
    rng.choice(document["ops"])["op"] = rng.choice([*names, "compact", "ADD_REQUEST"])


def shuffle_ops(rng: random.Random, document: dict[str, Any]) -> None:
    rng.shuffle(document["ops"])


def repeat_ops(rng: random.Random, document: dict[str, Any]) -> None:
    document["ops"] = document["ops"] * rng.choice([2, 50, 400])


def plausible_values(rng: random.Random, document: dict[str, Any]) -> None:
    """Redraw the pool and the operations' numbers within small ranges: mostly valid traces the corpus lacks."""
    document["config"]["num_blocks"] = rng.randint(2, 40)
    document["config"]["enable_caching"] = rng.random() < 0.5
    for op in document["ops"]:
        if op.get("op") == "schedule":
            op.update(
                num_new_tokens=rng.randint(1, 40),
                num_external_tokens=rng.randint(0, 12),
                sampled_token=rng.randint(0, 3),
            )
        elif op.get("op") == "add_request":
            op["prompt"] = [rng.randint(0, 2) for _ in range(rng.randint(1, 24))]
        elif op.get("op") == "evict_blocks":
            op["block_ids"] = [rng.randint(0, 1) for _ in range(rng.randint(1, 3))]


def values_at_the_limits(rng: random.Random, document: dict[str, Any]) -> None:
    """Push a few values to exactly their limits: the trace stays valid and replays."""
    config = document["config"]
    config["num_blocks"] = limits.MAX_NUM_BLOCKS
    for op in document["ops"]:
        if op.get("op") == "schedule":
            op[rng.choice(["num_new_tokens", "num_external_tokens", "sampled_token"])] = rng.choice(
                [limits.MAX_SCHEDULE_TOKENS, 0 if rng.random() < 0.5 else 1]
            )
        if op.get("op") == "add_request":
            op["prompt"] = op["prompt"] + [limits.MAX_TOKEN_ID]


DocumentMutation = Callable[[random.Random, dict[str, Any]], None]
DOCUMENT_MUTATIONS: list[DocumentMutation] = [
    swap_type,
    swap_type,
    drop_field,
    add_field,
    huge_number,
    huge_number,
    negative_number,
    long_string,
    long_list,
    deep_nesting,
    list_as_object,
    object_as_list,
    rename_op,
    shuffle_ops,
    repeat_ops,
    plausible_values,
    plausible_values,
    plausible_values,
    values_at_the_limits,
]


def dump(rng: random.Random, document: object) -> bytes:
    text = json.dumps(document)
    while NEST in text:
        depth = rng.choice([50, 900, 5_000, 200_000])
        opening, closing = ("[", "]") if rng.random() < 0.5 else ('{"a":', "}")
        text = text.replace(NEST, opening * depth + "1" + closing * depth, 1)
    return text.encode()


# -- mutations of the file's text ----------------------------------------------------------


def truncated(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data))]


def not_utf8(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80", b"\xfe\xff"]) + data[at:]


def special_numbers(rng: random.Random, data: bytes) -> bytes:
    """Replace a number with a literal Python's json reads but JSON forbids, or a float."""
    numbers = list(re.finditer(rb"(?<![\w.])\d+(?![\w.])", data))
    if not numbers:
        return data
    match = rng.choice(numbers)
    literal = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"1.0", b"1e3", b"0x10", b"7" * 5000])
    return data[: match.start()] + literal + data[match.end() :]


def byte_order_mark(rng: random.Random, data: bytes) -> bytes:
    return b"\xef\xbb\xbf" + data


TextMutation = Callable[[random.Random, bytes], bytes]
TEXT_MUTATIONS: list[TextMutation] = [truncated, truncated, not_utf8, special_numbers, byte_order_mark]


def mutate(rng: random.Random, document: dict[str, Any]) -> tuple[str, bytes]:
    """One mutation of a corpus document, or two or three together; returns its name and the file's bytes."""
    document = copy.deepcopy(document)
    roll = rng.random()
    if roll < 0.2:
        mutation = rng.choice(TEXT_MUTATIONS)
        return mutation.__name__, mutation(rng, dump(rng, document))
    count = 1 if roll < 0.75 else rng.choice([2, 3])
    names = []
    for _ in range(count):
        document_mutation = rng.choice(DOCUMENT_MUTATIONS)
        try:
            document_mutation(rng, document)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            # An earlier mutation took away what this one edits: the document stays as it was.
            continue
        names.append(document_mutation.__name__)
    return "+".join(names) or "unchanged", dump(rng, document)


FIXED_CASES = [
    Case("empty_file", b""),
    Case("whitespace_only", b" \n\t "),
    Case("null", b"null"),
    Case("number", b"1"),
    Case("string", b'"kvcheck-trace"'),
    Case("empty_list", b"[]"),
    Case("empty_object", b"{}"),
    Case("binary", bytes(range(256))),
    Case("latin1_text", S000.read_text().replace("Seed 000", "Seed \u00e9").encode("latin-1")),
    Case("utf16_text", S000.read_text().encode("utf-16")),
    Case("deep_lists", b"[" * 500_000 + b"]" * 500_000),
    Case("deep_objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
]


def build_cases() -> list[Case]:
    rng = random.Random(SEED)
    cases = list(FIXED_CASES)
    documents = [(path.stem, json.loads(path.read_text())) for path in CORPUS_PATHS]
    for index in range(MUTATED_CASES):
        stem, document = documents[index % len(documents)]
        name, data = mutate(rng, document)
        cases.append(Case(f"{stem}-{index:03d}-{name}", data))
    return cases


CASES = build_cases()


# -- the tests ------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_refusal(path: Path, out: str, err: str) -> None:
    assert out == "", out
    lines = err.splitlines()
    assert len(lines) == 1, err[:2000]
    assert lines[0].startswith(f"kvcheck: {path}: "), lines[0][:2000]
    assert len(lines[0]) < 1000, f"a refusal of {len(lines[0])} characters: {lines[0][:300]}..."


def assert_within_limits(path: Path) -> None:
    """A trace the command accepted holds no value beyond a limit, so replaying it is bounded."""
    trace = load_trace(path)
    assert len(trace.ops) <= limits.MAX_OPS
    assert trace.config.num_blocks <= limits.MAX_NUM_BLOCKS
    assert len(trace.config.groups) <= limits.MAX_GROUPS
    assert sum(len(op.prompt) for op in trace.ops if isinstance(op, AddRequest)) <= limits.MAX_TRACE_PROMPT_TOKENS


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case.name for case in CASES])
def test_a_mutated_trace_is_replayed_or_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, index: int
) -> None:
    """replay (and, for every fourth case, show) of a mutated trace exits 0, 1 or 2 with no traceback; a refusal
    is one line naming the file, and an accepted trace is within every limit."""
    case = CASES[index]
    path = tmp_path / "mutated.json"
    path.write_bytes(case.data)
    commands = ["replay", "show"] if index % SHOW_EVERY == 0 else ["replay"]
    for command in commands:
        code, out, err = run(capsys, command, str(path))
        assert code in (EXIT_OK, EXIT_VIOLATION, EXIT_BAD_INPUT), f"{command}: exit {code}"
        assert "Traceback" not in out + err, (out + err)[:3000]
        if code == EXIT_BAD_INPUT:
            assert_one_line_refusal(path, out, err)
            continue
        assert err == "", err
        assert_within_limits(path)
        if command == "replay":
            steps = re.search(r": (\d+) steps, every invariant held$|FAILED at step \d+ of (\d+)$", out, re.M)
            assert steps is not None, out[:2000]
            assert int(steps.group(1) or steps.group(2)) <= limits.MAX_OPS


def test_the_fuzz_cases_hold_every_mutation_and_both_outcomes() -> None:
    """Every mutation is among the cases, and the cases hold both traces the loader refuses and traces it
    accepts, so the fuzz test reaches replay and show and not only the loader."""
    names = " ".join(case.name for case in CASES)
    mutations = [m.__name__ for m in DOCUMENT_MUTATIONS] + [m.__name__ for m in TEXT_MUTATIONS]
    assert [m for m in mutations if m not in names] == []
    accepted = 0
    for case in CASES:
        try:
            parse_trace(case.data.decode("utf-8"), case.name)
        except (TraceError, UnicodeDecodeError):
            continue
        accepted += 1
    assert 20 <= accepted <= len(CASES) - 100, f"{accepted} of {len(CASES)} cases load"


def test_the_fuzz_cases_are_the_same_in_every_run() -> None:
    """Building the cases again from the fixed seed gives the same bytes, so a failing case can be rerun."""
    assert build_cases() == CASES


def test_a_pool_of_a_trillion_blocks_is_refused_before_any_replay(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """replay of a trace whose config asks for 10**12 blocks exits 2 naming num_blocks, the value and the limit,
    and never builds a target."""
    document = json.loads(S000.read_text())
    document["config"]["num_blocks"] = 10**12
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))

    def no_replay(*args: object) -> None:
        raise AssertionError("the trace was replayed")

    monkeypatch.setattr("kvcheck.replay.replay", no_replay)
    monkeypatch.setattr("kvcheck.replay.resolve_target", lambda *args: no_replay)
    code, out, err = run(capsys, "replay", str(path))
    assert code == EXIT_BAD_INPUT, out + err
    assert err == (
        f"kvcheck: {path}: field 'config.num_blocks': 1000000000000 is above the limit of {limits.MAX_NUM_BLOCKS}\n"
    )
    assert out == ""
