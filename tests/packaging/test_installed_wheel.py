"""kvcheck as an allocator team installs it: the wheel, in a fresh venv, run from an empty folder.

The wheel is built from a copy of the tracked files, installed into a new
venv (its dependencies come from the package index), and then used from a
folder that holds nothing but the team's own allocator factory: ``kvcheck
run`` and the pytest plugin both drive the whole suite against it, and a
planted fault fails with its repro written into that folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FACTORY = '''"""A team's own allocator, as kvcheck sees it: a factory from a TargetConfig to a target."""

from kvcheck.targets.kvcore_target import KvcoreTarget


def factory(config):
    return KvcoreTarget(config)
'''


OWN_CONFTEST = """def pytest_addoption(parser):
    parser.addoption("--target", default="theirs")
"""

OWN_TEST = """from hypothesis import given, settings, strategies as st


def test_their_option(request):
    assert request.config.getoption("--target") == "mine"


@given(st.integers())
def test_their_hypothesis_profile_is_untouched(value):
    # Hypothesis's own defaults: kvcheck's profiles (400 or more examples, 40-step runs) stay unloaded.
    assert (settings.default.max_examples, settings.default.stateful_step_count) == (100, 50)
"""


SMOKE = ("--profile", "smoke")
"""The installation is what is checked here, not the allocator: a derandomized handful of examples."""


def _tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.fail(f"git ls-files failed in {REPO}: {listed.stderr.strip()}")
    return listed.stdout.splitlines()


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


def _must(result: subprocess.CompletedProcess[str], what: str) -> str:
    assert result.returncode == 0, (
        f"{what} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result.stdout


def test_the_wheel_runs_the_suite_from_an_empty_folder(tmp_path: Path) -> None:
    source = tmp_path / "source"
    for name in _tracked_files():
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    wheels = tmp_path / "wheels"
    _must(
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(source)], tmp_path),
        "pip wheel",
    )
    (wheel,) = wheels.glob("kvcheck-*.whl")

    # Nothing with a generic name lands in site-packages: the suite lives inside kvcheck, beside kvcore and kvmodel.
    with zipfile.ZipFile(wheel) as archive:
        top_level = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        names = set(archive.namelist())
    assert top_level == {"kvcheck", "kvcore", "kvmodel"}, f"the wheel installs top-level {sorted(top_level)}"
    for shipped in (
        "kvmodel/invariants/__init__.py",
        "kvcheck/stateful_tests/manager_machine.py",
        "kvcheck/regressions/test_replay.py",
        "kvcheck/regressions/traces/s000_fifo_reuse_when_caching_off.json",
    ):
        assert shipped in names, f"the wheel lacks {shipped}"

    venv = tmp_path / "venv"
    _must(_run([sys.executable, "-m", "venv", str(venv)], tmp_path), "python -m venv")
    bin_dir = venv / "bin"
    _must(_run([str(bin_dir / "pip"), "install", "--quiet", str(wheel)], tmp_path), "pip install of the wheel")

    work = tmp_path / "empty"
    work.mkdir()
    (work / "myalloc.py").write_text(FACTORY)
    env = {**os.environ, "CI": "true", "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("HYPOTHESIS_PROFILE", None)
    env.pop("PYTHONPATH", None)

    missing = _run([str(bin_dir / "python"), "-c", "import models"], work, env)
    assert missing.returncode != 0, "the installed kvcheck made a top-level 'models' importable"

    ran = _must(
        _run(
            [
                str(bin_dir / "kvcheck"),
                "run",
                "--target",
                "myalloc:factory",
                "--groups",
                "1",
                "--swarm-runs",
                "50",
                *SMOKE,
            ],
            work,
            env,
        ),
        "kvcheck run --target myalloc:factory",
    )
    assert "kvcheck summary: target myalloc:factory" in ran
    assert "stateful_tests/test_manager_machine.py" in ran and "regressions/test_replay.py" in ran, ran
    assert "verdict: every invariant held" in ran and "swarm verdict: every invariant held" in ran, ran

    plugin = _must(
        _run(
            [
                str(bin_dir / "pytest"),
                "-q",
                "-p",
                "kvcheck",
                "--pyargs",
                "kvcheck.stateful_tests",
                "kvcheck.regressions",
                "--kvcheck-target",
                "myalloc:factory",
                "--kvcheck-groups",
                "1",
                "--hypothesis-profile",
                "smoke",
            ],
            work,
            env,
        ),
        "pytest -p kvcheck --pyargs kvcheck.stateful_tests kvcheck.regressions",
    )
    assert " passed" in plugin and "failed" not in plugin, plugin

    # The plugin loads into every pytest run of the venv; a repository's own tests, with an option of
    # their own named --target and Hypothesis tests of their own, run as before.
    own = work / "own_tests"
    own.mkdir()
    (own / "conftest.py").write_text(OWN_CONFTEST)
    (own / "test_own.py").write_text(OWN_TEST)
    _must(_run([str(bin_dir / "pytest"), "-q", "own_tests", "--target", "mine"], work, env), "a repository's own tests")

    faulty = _run(
        [
            str(bin_dir / "kvcheck"),
            "run",
            "--fault",
            "fifo-reuse-when-caching-off",
            "--groups",
            "1",
            "--swarm-runs",
            "50",
            *SMOKE,
        ],
        work,
        env,
    )
    assert faulty.returncode == 1, f"a planted seed fault passed:\n{faulty.stdout[-4000:]}\n{faulty.stderr[-2000:]}"
    repros = sorted(path.name for path in (work / "repros").glob("*.json"))
    assert repros, "the failing run wrote no repro into the folder it ran from"
    replayed = _run(
        [
            str(bin_dir / "kvcheck"),
            "replay",
            str(work / "repros" / repros[0]),
            "--fault",
            "fifo-reuse-when-caching-off",
        ],
        work,
        env,
    )
    assert replayed.returncode == 1, f"the repro did not fail on replay under its fault:\n{replayed.stdout}"
