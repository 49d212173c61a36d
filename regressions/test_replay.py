"""The regression corpus: every minimal repro ever kept, replayed on every run.

Each trace must replay clean on the target under test; a trace tagged
``fails: INVARIANT`` under a fault must still fail that way when the fault
is planted into kvcore, so the corpus keeps its teeth.  That check plants
into kvcore whatever ``--target`` says; the faults also expressed against
vLLM are checked on vLLM when ``--target`` names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.corpus import Corpus
from kvcheck.replay import replay, resolve_target
from kvcheck.targets import TargetFactory, component_allocators
from kvcheck.trace import Trace, load_trace
from kvcheck.vllm_faults import VLLM_FAULTS

CORPUS = Corpus(Path(__file__).with_name("traces"))
TRACE_PATHS = CORPUS.paths()
TAGGED = [path for path in TRACE_PATHS if (trace := load_trace(path)).expect and trace.expect.fault]
TAGGED_ON_VLLM = [path for path in TAGGED if (trace := load_trace(path)).expect and trace.expect.fault in VLLM_FAULTS]


def _load(path: Path) -> Trace:
    return load_trace(path)


def test_the_corpus_holds_traces() -> None:
    """The corpus is not empty: the seed bugs' repros at least are in it."""
    assert len(TRACE_PATHS) >= 2, f"no traces found under {CORPUS.folder}"


@pytest.mark.parametrize("path", TRACE_PATHS, ids=[p.stem for p in TRACE_PATHS])
def test_trace_replays_clean(path: Path, make_target: TargetFactory) -> None:
    """Replaying the trace on the target under test keeps every invariant after every step."""
    outcome = replay(_load(path), make_target)
    assert outcome.violation is None, f"{path.name}: {outcome.violation}"


def _fails_as_tagged(path: Path, allocator: str) -> None:
    trace = _load(path)
    assert trace.expect is not None and trace.expect.fault is not None
    outcome = replay(trace, resolve_target(allocator, trace.expect.fault))
    assert outcome.violation is not None, f"{path.name}: no invariant failed under {trace.expect.fault} on {allocator}"
    assert outcome.violation.invariant == trace.expect.invariant, (
        f"{path.name} on {allocator}: expected {trace.expect.invariant}, got {outcome.violation}"
    )


@pytest.mark.parametrize("path", TAGGED, ids=[p.stem for p in TAGGED])
def test_tagged_trace_fails_as_tagged_with_its_fault_planted_in_kvcore(path: Path) -> None:
    """With its fault planted into kvcore (whatever --target names), the trace fails with the
    invariant it is tagged with."""
    _fails_as_tagged(path, "kvcore")


@pytest.mark.parametrize("path", TAGGED_ON_VLLM, ids=[p.stem for p in TAGGED_ON_VLLM])
def test_tagged_trace_fails_as_tagged_with_its_fault_planted_in_vllm(
    path: Path, request: pytest.FixtureRequest
) -> None:
    """With its fault patched onto vLLM, the trace fails on vLLM with the invariant it is tagged
    with (for the faults expressed against vLLM; run when --target names vllm)."""
    target = request.config.getoption("--target")
    if "vllm" not in component_allocators(target):
        pytest.skip(f"--target {target} does not name vllm")
    _fails_as_tagged(path, "vllm")


def test_each_fault_and_invariant_pair_is_kept_once() -> None:
    """The corpus keeps one trace per distinct (fault or finding, invariant)."""
    seen: dict[tuple[str, str | None], str] = {}
    for path, trace in CORPUS.traces():
        key = (
            trace.provenance.source if trace.provenance else path.stem,
            trace.expect.invariant if trace.expect else None,
        )
        assert key not in seen, f"{path.name} repeats {seen[key]} for {key}"
        seen[key] = path.name
