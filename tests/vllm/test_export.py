"""``kvcheck export``: a corpus trace as a standalone pytest file that imports vLLM, never kvcheck.

Every corpus trace is exported, then all the exported files run in one pytest subprocess on vLLM as
installed (each must pass), and the traces of the faults expressed against vLLM run in a second one with
their fault planted by ``export_fault_plugin`` (each must fail, naming the invariant the trace expects).

Runs only where vLLM 0.33.0 imports (``scripts/install-vllm-cpu.sh VENV_DIR``); in the default set-up
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
from kvcheck.models.invariants import ALL_INVARIANTS  # noqa: E402
from kvcheck.targets.vllm_target import VllmUnavailable, require_vllm  # noqa: E402
from kvcheck.trace import Trace, load_trace  # noqa: E402
from kvcheck.vllm_faults import VLLM_FAULTS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted((REPO / "regressions" / "traces").glob("*.json"))
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
    with planted_in_process("interleaved-external-alloc"):
        (folder / BUGGY_EXPORT).write_text(export_trace(load_trace(S003), S003.name))
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


@pytest.mark.parametrize("path", [S003, DEFERRED], ids=["s003", "deferred-frees"])
def test_the_same_trace_exports_to_the_same_text(path: Path) -> None:
    """Export is deterministic: the same trace (read twice) gives the same file, byte for byte."""
    first = export_trace(load_trace(path), path.name)
    second = export_trace(load_trace(path), path.name)
    assert first == second


def test_the_docstring_names_the_trace_its_expectation_and_how_to_run_it() -> None:
    """The file says which trace it is, which invariant the trace expects under which fault, and how to run it."""
    text = export_trace(load_trace(S003), S003.name)
    docstring = ast.get_docstring(ast.parse(text)) or ""
    flat = " ".join(docstring.split())
    assert S003.name in flat
    assert "fail with no_duplicate_block_ids when the fault interleaved-external-alloc is planted" in flat
    assert "pytest THIS_FILE" in flat and "vLLM 0.33.0" in flat
    assert str(REPO) not in text, "an absolute path of this machine"


def test_every_assertion_names_an_invariant() -> None:
    """Each ``step.expect`` the file makes names one of kvcheck's invariants."""
    text = export_trace(load_trace(S003), S003.name)
    named = re.findall(r'step\.expect\(\s*"(\w+)"', text)
    assert named, text
    assert set(named) <= NAMED_FAILURES


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
