"""Writing a failing run out as a portable trace and a standalone pytest file."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from kvcheck.trace import Expectation, Provenance, Trace
from kvmodel.config import TargetConfig
from kvmodel.invariants import InvariantViolation
from kvmodel.ops import Operation

STANDALONE = '''"""Standalone repro: {invariant} violated at step {step}.

Found by {origin}.  Run it alone with `pytest {py_name}` wherever kvcheck
is installed; it fails until the bug is fixed.  The same trace replays with
`kvcheck replay {json_name}{fault_flag}`.
"""

from kvcheck.replay import replay, resolve_target
from kvcheck.trace import parse_trace

TRACE = """\\
{trace_text}"""


def test_trace_keeps_every_invariant() -> None:
    """Replaying the trace keeps every invariant after every step."""
    outcome = replay(parse_trace(TRACE, "{json_name}"), resolve_target({target!r}, {fault!r}))
    assert outcome.violation is None, str(outcome.violation)
'''


def failing_trace(
    config: TargetConfig, ops: list[Operation], violation: InvariantViolation, fault: str | None, origin: str
) -> Trace:
    """The trace of a failing run, cut at the failing step, tagged with its invariant and fault."""
    return Trace(
        config,
        tuple(ops[: violation.step]),
        Expectation(violation.invariant, fault),
        Provenance(f"fault:{fault}" if fault else "finding:unnamed", datetime.date.today().isoformat(), origin),
    )


def write_repro(trace: Trace, folder: Path, stem: str, target: str = "kvcore") -> tuple[Path, Path]:
    """Write ``stem.json`` and ``test_stem.py`` into ``folder``; returns both paths."""
    assert trace.expect is not None
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", stem).strip("_")
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / f"{stem}.json"
    py_path = folder / f"test_{stem}.py"
    text = trace.dumps()
    json_path.write_text(text)
    fault = trace.expect.fault
    py_path.write_text(
        STANDALONE.format(
            invariant=trace.expect.invariant,
            step=len(trace.ops),
            origin=(trace.provenance.story if trace.provenance else "kvcheck").replace("\\", "/").replace('"', "'"),
            py_name=py_path.as_posix(),
            json_name=json_path.as_posix(),
            fault_flag=f" --fault {fault}" if fault else "",
            trace_text=text.replace("\\", "\\\\"),
            target=target,
            fault=fault,
        )
    )
    return json_path, py_path
