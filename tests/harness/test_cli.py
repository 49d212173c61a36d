"""The kvcheck command: replay, show, faults and promote, their output and their exit codes
(0 ok, 1 an invariant violated, 2 bad input), the limits on its options, and its help."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck import kill_matrix
from kvcheck.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_VIOLATION, main
from kvcheck.trace import load_trace
from kvmodel import limits
from tests.harness.test_trace_format import CORPUS_PATHS, MALFORMED, REPO, S000, S003, Malformed, write_malformed

S003_FAULT = "interleaved-external-alloc"
S003_INVARIANT = "no_duplicate_block_ids"
SEED_FAULTS = ("fifo-reuse-when-caching-off", "interleaved-external-alloc")


def kvcheck(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """Run the kvcheck command in-process; returns the exit code, stdout and stderr."""
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def folder_state(folder: Path) -> dict[str, bytes]:
    """Every file in a folder and its bytes, to show a refused command changed nothing."""
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())} if folder.exists() else {}


# -- replay ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", CORPUS_PATHS, ids=[p.stem for p in CORPUS_PATHS])
def test_replay_of_a_corpus_trace_holds_every_invariant(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    """Replaying a corpus trace on plain kvcore exits 0 and says every invariant held."""
    code, out, err = kvcheck(capsys, "replay", path)
    assert code == EXIT_OK, out + err
    assert "every invariant held" in out, out


def test_replay_under_its_fault_names_the_invariant_and_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    """Replaying s003 with its fault planted exits 1 and names the violated invariant and the failing step."""
    steps = len(load_trace(S003).ops)
    code, out, err = kvcheck(capsys, "replay", "--fault", S003_FAULT, S003)
    assert code == EXIT_VIOLATION, out + err
    assert f"FAILED at step {steps} of {steps}" in out, out
    assert f"{S003_INVARIANT} violated at step {steps}" in out, out


@pytest.mark.parametrize("case", MALFORMED, ids=[case.name for case in MALFORMED])
def test_replay_of_a_malformed_trace_is_bad_input_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: Malformed
) -> None:
    """A malformed trace exits 2 with one stderr line naming the file, step and field, and no traceback."""
    path = write_malformed(case, tmp_path)
    code, out, err = kvcheck(capsys, "replay", path)
    assert code == EXIT_BAD_INPUT, out + err
    assert out == "", out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0], err
    if case.step is not None:
        assert f"step {case.step}" in lines[0], err
    if case.field is not None:
        assert f"field '{case.field}'" in lines[0], err
    assert "Traceback" not in err, err


def test_replay_with_an_unknown_fault_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    """Asking for a fault the catalogue does not hold exits 2 and names it."""
    code, out, err = kvcheck(capsys, "replay", "--fault", "no-such-fault", S000)
    assert code == EXIT_BAD_INPUT, out + err
    assert "no-such-fault" in err, err
    assert "Traceback" not in err, err


def test_replay_of_a_missing_file_is_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A trace path that does not exist exits 2 with a message naming it."""
    path = tmp_path / "absent.json"
    code, out, err = kvcheck(capsys, "replay", path)
    assert code == EXIT_BAD_INPUT, out + err
    assert str(path) in err, err


# -- show ---------------------------------------------------------------------------------


def test_show_under_the_fault_renders_every_step_and_ends_with_the_violation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """show of s003 under its fault prints every step, marks changed cells, ends on a '!!' line; exit 1."""
    steps = len(load_trace(S003).ops)
    code, out, err = kvcheck(capsys, "show", "--fault", S003_FAULT, S003)
    assert code == EXIT_VIOLATION, out + err
    lines = out.splitlines()
    for step in range(1, steps + 1):
        assert any(line.startswith(f"step {step}: ") for line in lines), f"step {step} missing:\n{out}"
    assert "  * free queue (head first)   [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" in lines, out
    preempt = lines.index("step 3: preempt(r0)")
    assert lines[preempt + 1].startswith("  * free queue"), "the free queue changed by the preemption is not marked"
    assert lines[preempt + 3].startswith("    cache g0 0 "), "a cache entry unchanged by the preemption is marked"
    assert lines[-1].startswith("!! "), lines[-1]
    assert S003_INVARIANT in lines[-1], lines[-1]
    assert "\033[" not in out, "colour codes written to a stream that is not a terminal"


def test_show_without_the_fault_ends_with_every_invariant_held(capsys: pytest.CaptureFixture[str]) -> None:
    """show of s003 on plain kvcore exits 0 and its last line says every invariant held."""
    code, out, err = kvcheck(capsys, "show", S003)
    assert code == EXIT_OK, out + err
    assert out.splitlines()[-1].startswith("every invariant held"), out
    assert "!!" not in out, out


def test_show_renders_deferred_frees_and_steps_in_flight(capsys: pytest.CaptureFixture[str]) -> None:
    """An async trace with deferred frees shows what each deferred free holds and what each step in
    flight reads, so the failing difference can be read off the screen."""
    trace = str(S003.parent / "fault_deferred_free_in_eviction_order.json")
    code, out, err = kvcheck(capsys, "show", "--fault", "deferred-free-in-eviction-order", trace)
    assert code == EXIT_VIOLATION, out + err
    assert "  * in flight 0               r0 reads [[1], [2]]" in out.splitlines(), out
    assert "  * deferred free 0           holds [2, 1]" in out.splitlines(), out
    code, out, err = kvcheck(capsys, "show", trace)
    assert code == EXIT_OK, out + err
    assert "  * deferred free 0           holds [1, 2]" in out.splitlines(), out


# -- faults -------------------------------------------------------------------------------


def test_faults_lists_both_seed_faults(capsys: pytest.CaptureFixture[str]) -> None:
    """The fault catalogue printed by `kvcheck faults` starts a line with each seed fault."""
    code, out, err = kvcheck(capsys, "faults")
    assert code == EXIT_OK, out + err
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    for fault in SEED_FAULTS:
        assert fault in names, out


# -- promote ------------------------------------------------------------------------------


def promote(
    capsys: pytest.CaptureFixture[str], trace: Path, corpus: Path, name: str, story: str = "a story"
) -> tuple[int, str, str]:
    """Run `kvcheck promote` of ``trace`` into the ``corpus`` folder."""
    return kvcheck(capsys, "promote", trace, "--name", name, "--story", story, "--corpus", corpus)


def test_promote_adds_a_failing_trace_with_its_provenance(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Promoting s003 writes a new corpus file whose provenance names its fault, today's date and the story."""
    corpus = tmp_path / "corpus"
    code, out, err = promote(capsys, S003, corpus, "double_alloc", "  one block in two groups  ")
    assert code == EXIT_OK, out + err
    assert out.startswith("added "), out
    assert folder_state(corpus).keys() == {"double_alloc.json"}
    added = load_trace(corpus / "double_alloc.json")
    original = load_trace(S003)
    assert added.provenance is not None
    assert added.provenance.source == f"fault:{S003_FAULT}"
    assert added.provenance.date == datetime.date.today().isoformat()
    assert added.provenance.story == "one block in two groups"
    assert (added.config, added.ops, added.expect) == (original.config, original.ops, original.expect)


def test_promoting_an_equivalent_trace_again_is_redundant(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A second trace of the same fault and invariant is reported redundant and writes nothing."""
    corpus = tmp_path / "corpus"
    assert promote(capsys, S003, corpus, "first")[0] == EXIT_OK
    before = folder_state(corpus)
    code, out, err = promote(capsys, S003, corpus, "second")
    assert code == EXIT_OK, out + err
    assert "redundant" in out, out
    assert "first.json" in out, out
    assert folder_state(corpus) == before


def retagged_s000(folder: Path) -> Path:
    """s000 tagged with a fault it does not trip (it has a single group, the fault needs two)."""
    document = json.loads(S000.read_text())
    document["expect"]["fault"] = S003_FAULT
    path = folder / "retagged.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    ("name", "story", "message"),
    [
        ("not_failing", "a story", "should fail with"),
        ("../escape", "a story", "--name"),
        ("has space", "a story", "--name"),
        ("", "a story", "--name"),
        ("no_story", "   ", "--story"),
    ],
    ids=["not_failing_under_its_fault", "name_with_slash", "name_with_space", "empty_name", "empty_story"],
)
def test_a_refused_promote_is_bad_input_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, story: str, message: str
) -> None:
    """A promote that cannot be kept exits 2 with a one-line reason and leaves the corpus folder as it was."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    assert promote(capsys, S000, corpus, "seed")[0] == EXIT_OK
    before = folder_state(corpus)
    candidate = retagged_s000(tmp_path) if name == "not_failing" else S003
    code, out, err = promote(capsys, candidate, corpus, name, story)
    assert code == EXIT_BAD_INPUT, out + err
    assert message in err, err
    assert len(err.splitlines()) == 1, err
    assert out == "", out
    assert folder_state(corpus) == before
    assert not (tmp_path / "escape.json").exists()


def test_promote_refuses_to_overwrite_an_existing_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Promoting under a name the corpus already holds exits 2 and keeps the old file."""
    corpus = tmp_path / "corpus"
    assert promote(capsys, S000, corpus, "taken")[0] == EXIT_OK
    before = folder_state(corpus)
    code, out, err = promote(capsys, S003, corpus, "taken")
    assert code == EXIT_BAD_INPUT, out + err
    assert "exists already" in err, err
    assert folder_state(corpus) == before


# -- option limits ---------------------------------------------------------------------------


def must_not_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("a refused command started running")


OPTION_LIMITS = [
    ("run", "--swarm-runs", -1, "-1 is below the minimum of 0"),
    ("run", "--swarm-runs", 10**12, f"1000000000000 is above the limit of {limits.MAX_SWARM_RUNS}"),
    ("run", "--seed", -5, "-5 is below the minimum of 0"),
    ("run", "--seed", 2**64, f"{2**64} is above the limit of {limits.MAX_SEED}"),
    ("run", "--groups", 0, "0 is below the minimum of 1"),
    ("run", "--groups", limits.MAX_GROUPS + 1, f"{limits.MAX_GROUPS + 1} is above the limit of {limits.MAX_GROUPS}"),
    ("run", "--full-check-every", 0, "0 is below the minimum of 1"),
    (
        "run",
        "--full-check-every",
        limits.MAX_FULL_CHECK_EVERY + 1,
        f"{limits.MAX_FULL_CHECK_EVERY + 1} is above the limit of {limits.MAX_FULL_CHECK_EVERY}",
    ),
    ("kill-matrix", "--seeds", 0, "0 is below the minimum of 1"),
    ("kill-matrix", "--seeds", 10**6, f"1000000 is above the limit of {limits.MAX_KILL_MATRIX_SEEDS}"),
    ("kill-matrix", "--runs", -1, "-1 is below the minimum of 1"),
    ("kill-matrix", "--runs", 10**100, f"(101 digits) is above the limit of {limits.MAX_SWARM_RUNS}"),
]


@pytest.mark.parametrize(
    ("command", "option", "value", "message"),
    OPTION_LIMITS,
    ids=[f"{command}{option}={'huge' if value > 10**9 else value}" for command, option, value, _ in OPTION_LIMITS],
)
def test_an_option_out_of_range_is_bad_input_and_changes_nothing(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    option: str,
    value: int,
    message: str,
) -> None:
    """A negative or absurd option exits 2 with one line naming the option, the value and the limit;
    nothing runs, the working directory stays put and no file is written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pytest, "main", must_not_run)
    monkeypatch.setattr(kill_matrix, "kill_matrix", must_not_run)
    outputs = ["--json", str(tmp_path / "matrix.json"), "--traces", str(tmp_path / "traces")]
    code, out, err = kvcheck(capsys, command, option, str(value), *(outputs if command == "kill-matrix" else []))
    assert code == EXIT_BAD_INPUT, out + err
    assert out == "", out
    assert err.splitlines() == [err.rstrip("\n")], err
    assert err.startswith(f"kvcheck: {option}: "), err
    assert message in err, err
    assert Path.cwd() == tmp_path
    assert folder_state(tmp_path) == {}


def test_run_accepts_options_at_their_limits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvcheck run` with --groups, --seed and --swarm-runs at their limits passes them on to the suite."""
    monkeypatch.chdir(tmp_path)
    received: list[list[str]] = []
    monkeypatch.setattr(pytest, "main", lambda args, plugins: received.append(args) or 0)
    code, out, err = kvcheck(capsys, "run", "--groups", limits.MAX_GROUPS, "--seed", limits.MAX_SEED, "--swarm-runs", 0)
    assert code == EXIT_OK, out + err
    assert len(received) == 1
    assert f"--kvcheck-groups={limits.MAX_GROUPS}" in received[0], received


def test_kill_matrix_accepts_options_at_their_limits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvcheck kill-matrix` with --seeds and --runs at their limits runs with that budget."""
    budgets: list[kill_matrix.KillBudget] = []
    monkeypatch.setattr(kill_matrix, "kill_matrix", lambda names, budget, *a, **k: budgets.append(budget) or [])
    matrix = tmp_path / "matrix.json"
    code, out, err = kvcheck(
        capsys,
        "kill-matrix",
        "--seeds",
        limits.MAX_KILL_MATRIX_SEEDS,
        "--runs",
        limits.MAX_SWARM_RUNS,
        "--json",
        matrix,
        "--traces",
        tmp_path / "traces",
    )
    assert code == EXIT_OK, out + err
    assert [(len(b.seeds), b.runs_per_seed) for b in budgets] == [(limits.MAX_KILL_MATRIX_SEEDS, limits.MAX_SWARM_RUNS)]
    assert json.loads(matrix.read_text()) == []


# -- help ------------------------------------------------------------------------------------

TARGET_FORMS = ("'kvcore'", "'vllm'", "'package.module:factory'", "'+'", "'kvcore+vllm'")
"""Every form of --target that kvcheck.targets.load_target accepts, as the help must name it."""


@pytest.mark.parametrize("command", ["run", "replay", "show"])
def test_the_target_help_names_every_target_form(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """The --target help of run, replay and show names kvcore, vllm, a factory and targets joined by '+'."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    target_help = help_text[help_text.rindex("--target TARGET") :]
    missing = [form for form in TARGET_FORMS if form not in target_help.split("--fault")[0]]
    assert not missing, target_help


def test_the_pytest_target_option_help_names_every_target_form() -> None:
    """`pytest --help` describes --target with every form the suite accepts."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "1000"},
    )
    assert result.returncode == 0, result.stderr
    help_text = " ".join(result.stdout.split())
    target_help = help_text[help_text.index("--target=TARGET") :].split("--fault")[0]
    missing = [form for form in TARGET_FORMS if form not in target_help]
    assert not missing, target_help


# -- the installed console script -----------------------------------------------------------


@pytest.mark.parametrize(
    ("malformed", "expected"),
    [(False, EXIT_OK), (True, EXIT_BAD_INPUT)],
    ids=["corpus_trace", "malformed_trace"],
)
def test_the_console_script_replays_with_the_documented_exit_code(
    tmp_path: Path, malformed: bool, expected: int
) -> None:
    """The installed `kvcheck` executable runs replay and exits 0 on a good trace, 2 on a malformed one."""
    executable = Path(sys.executable).with_name("kvcheck")
    assert executable.is_file(), f"no console script next to {sys.executable}"
    trace = write_malformed(MALFORMED[0], tmp_path) if malformed else S000
    result = subprocess.run(
        [str(executable), "replay", str(trace)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == expected, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    if malformed:
        assert str(trace) in result.stderr, result.stderr
    else:
        assert "every invariant held" in result.stdout, result.stdout


def test_doctor_names_the_semantics_followed_and_each_behaviour(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvcheck doctor` says which vLLM is installed, which release's semantics kvcheck follows, and which
    behaviours of the table are in force on them (in the default set-up, without vLLM: the newest)."""
    from kvcheck.vllm_releases import semantics_in_force
    from kvmodel.semantics import BEHAVIOURS

    assert main(["doctor"]) == EXIT_OK
    out = capsys.readouterr().out
    semantics = semantics_in_force()
    assert f"semantics: {semantics.describe()}" in out
    for row in BEHAVIOURS:
        mark = "x" if semantics.has(row.name) else " "
        assert f"[{mark}] {row.name} (since {row.since};" in out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--runs", "0"], "--runs: 0 is below the minimum of 1"),
        (["--seed", "-1"], "--seed: -1 is below the minimum of 0"),
        (["--trace-out", "no-such-folder/failure.json"], "--trace-out: no-such-folder/failure.json: the folder"),
    ],
)
def test_scheduler_with_bad_options_is_bad_input_before_any_run(
    capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    """`kvcheck scheduler` refuses out-of-range options and a trace path in a missing folder up front,
    vLLM installed or not."""
    assert main(["scheduler", *arguments]) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err
