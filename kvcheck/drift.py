"""The drift detector: the same calls on two vLLM releases, their outcomes diffed step by step.

``kvcheck drift record FILE`` drives the installed vLLM alone (no model, no
invariants) through the regression corpus and a fixed swarm, with the
scheduler calls of one release's semantics (the oldest known by default, so
that every release gets the same calls), and writes every step's result and
observed state.  ``kvcheck drift compare A B`` diffs two such files, recorded
in venvs of two releases, and reports each run's first differing step and
field.  A difference is either a behaviour that belongs in the table of
``kvcheck/vllm_releases.py`` or a finding about vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from kvcheck.lockstep import Lockstep
from kvcheck.swarm import swarm
from kvcheck.targets import load_target
from kvcheck.trace import Trace, TraceError, load_trace, parse_trace
from kvcheck.vllm_releases import semantics_overridden
from kvmodel.ops import describe_op
from kvmodel.semantics import KNOWN_VERSIONS, Semantics

FORMAT = "kvcheck-drift"
VERSION = 1


class DriftFileError(ValueError):
    """A drift file that cannot be read: ``where`` names it, the message says why."""


@attrs.frozen
class Drift:
    """The first step of run ``run`` whose ``field`` differs between the two recordings."""

    run: str
    step: int
    op: str
    field: str
    first: str
    second: str

    def __str__(self) -> str:
        return f"{self.run}: step {self.step} ({self.op}): {self.field}: {self.first} != {self.second}"


def canonical(value: Any) -> Any:
    """``value`` as plain JSON data with a fixed order: sets sorted, attrs classes as dicts."""
    if attrs.has(type(value)):
        return {field.name: canonical(getattr(value, field.name)) for field in attrs.fields(type(value))}
    if isinstance(value, (set, frozenset)):
        return sorted((canonical(item) for item in value), key=repr)
    if isinstance(value, Mapping):
        return [[canonical(key), canonical(item)] for key, item in sorted(value.items(), key=lambda kv: repr(kv[0]))]
    if isinstance(value, (list, tuple)):
        return [canonical(item) for item in value]
    return value


def record_run(name: str, trace: Trace) -> dict[str, Any]:
    """The steps of ``trace`` on the installed vLLM: each step's result and state, or what it raised."""
    target = load_target("vllm")(trace.config.validate())
    steps: list[dict[str, Any]] = []
    for op in trace.ops:
        try:
            result = target.apply(op)
            state = target.observe()
        except Exception as exc:  # a defect of the release is part of its behaviour
            steps.append({"op": describe_op(op), "raised": f"{type(exc).__name__}: {exc}"})
            break
        steps.append({"op": describe_op(op), "result": canonical(result), "state": canonical(state)})
    return {"name": name, "trace": trace.to_json(), "steps": steps}


def swarm_traces(seed: int, runs: int) -> list[tuple[str, Trace]]:
    """``runs`` runs of the swarm from ``seed``, as kvcore and the model drive them (the same on every
    release under the same semantics)."""
    traces: list[tuple[str, Trace]] = []

    def keep(lockstep: Lockstep) -> None:
        traces.append((f"swarm-{seed}-{len(traces)}", Trace(lockstep.config, tuple(lockstep.trace))))

    swarm(load_target("kvcore"), seed=seed, max_runs=runs, check=False, on_run=keep)
    return traces


def record(corpus: Iterable[Path], seed: int, swarm_runs: int, semantics: str = KNOWN_VERSIONS[0]) -> dict[str, Any]:
    """A drift file's document: the corpus traces and ``swarm_runs`` swarm runs on the installed vLLM,
    driven with the scheduler calls of release ``semantics``."""
    import vllm

    with semantics_overridden(Semantics(semantics)):
        runs = [(path.name, load_trace(path)) for path in sorted(corpus)] + swarm_traces(seed, swarm_runs)
        recorded = [record_run(name, Trace(trace.config, trace.ops)) for name, trace in runs]
    return {"format": FORMAT, "version": VERSION, "vllm": vllm.__version__, "semantics": semantics, "runs": recorded}


def read(path: Path) -> dict[str, Any]:
    """A drift file, checked for its format; :class:`DriftFileError` names the file and what is wrong."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DriftFileError(f"{path}: cannot read a drift file: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT or document.get("version") != VERSION:
        raise DriftFileError(f"{path}: not a drift file of format {FORMAT!r} version {VERSION}")
    for field in ("vllm", "semantics", "runs"):
        if field not in document:
            raise DriftFileError(f"{path}: field {field!r} is missing")
    if not isinstance(document["runs"], list):
        raise DriftFileError(f"{path}: field 'runs' is not a list")
    for index, run in enumerate(document["runs"]):
        if not isinstance(run, dict) or not {"name", "trace", "steps"} <= set(run):
            raise DriftFileError(f"{path}: runs[{index}] lacks name, trace or steps")
        try:
            parse_trace(json.dumps(run["trace"]), f"{path}: runs[{index}].trace")
        except TraceError as exc:
            raise DriftFileError(str(exc)) from exc
    return document


def compare(first: Mapping[str, Any], second: Mapping[str, Any]) -> list[Drift]:
    """Each run's first step and field that differ between two recordings of the same runs."""
    if first["semantics"] != second["semantics"]:
        raise DriftFileError(
            f"the recordings follow different scheduler semantics ({first['semantics']}, {second['semantics']}): "
            "record both with the same --semantics"
        )
    others = {run["name"]: run for run in second["runs"]}
    drifts: list[Drift] = []
    for run in first["runs"]:
        other = others.get(run["name"])
        if other is None or other["trace"] != run["trace"]:
            raise DriftFileError(f"run {run['name']}: not recorded from the same operations in both files")
        drift = _first_drift(run["name"], run["steps"], other["steps"])
        if drift is not None:
            drifts.append(drift)
    return drifts


def _first_drift(name: str, steps: list[dict[str, Any]], others: list[dict[str, Any]]) -> Drift | None:
    for number, (step, other) in enumerate(zip(steps, others), start=1):
        for part in ("raised", "result", "state"):
            mine, theirs = step.get(part), other.get(part)
            if mine == theirs:
                continue
            if isinstance(mine, dict) and isinstance(theirs, dict):
                for field in sorted(set(mine) | set(theirs)):
                    if mine.get(field) != theirs.get(field):
                        return Drift(
                            name,
                            number,
                            step["op"],
                            f"{part}.{field}",
                            _short(mine.get(field)),
                            _short(theirs.get(field)),
                        )
            return Drift(name, number, step["op"], part, _short(mine), _short(theirs))
    if len(steps) != len(others):
        return Drift(name, min(len(steps), len(others)) + 1, "-", "steps", str(len(steps)), str(len(others)))
    return None


def _short(value: Any, limit: int = 200) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
