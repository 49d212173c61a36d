"""The regression corpus: every minimal repro ever kept, replayed on every run.

Each trace must replay clean on the target under test; a trace tagged
``fails: INVARIANT`` under a fault must still fail that way when the fault
is planted into kvcore, so the corpus keeps its teeth.  That check plants
into kvcore whatever ``--target`` says, and the faults also expressed
against vLLM into vLLM as well when ``--target`` names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.corpus import Corpus
from kvcheck.faults import VLLM_FAULTS
from kvcheck.replay import replay, resolve_target
from kvcheck.targets import TargetFactory, component_allocators
from kvcheck.trace import Trace, load_trace

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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tagged traces are planted into kvcore always, and into vLLM too when --target names it."""
    if "planted_into" not in metafunc.fixturenames:
        return
    pairs = [("kvcore", path) for path in TAGGED]
    if "vllm" in component_allocators(metafunc.config.getoption("kvcheck_target")):
        pairs += [("vllm", path) for path in TAGGED_ON_VLLM]
    metafunc.parametrize(("planted_into", "path"), pairs, ids=[f"{a}-{p.stem}" for a, p in pairs])


def test_tagged_trace_fails_as_tagged_with_its_fault_planted(planted_into: str, path: Path) -> None:
    """With its fault planted into kvcore, or patched onto vLLM for the faults expressed against it
    (when --target names vllm), the trace fails with the invariant it is tagged with."""
    trace = _load(path)
    assert trace.expect is not None and trace.expect.fault is not None
    outcome = replay(trace, resolve_target(planted_into, trace.expect.fault))
    assert outcome.violation is not None, (
        f"{path.name}: no invariant failed under {trace.expect.fault} on {planted_into}"
    )
    assert outcome.violation.invariant == trace.expect.invariant, (
        f"{path.name} on {planted_into}: expected {trace.expect.invariant}, got {outcome.violation}"
    )


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
