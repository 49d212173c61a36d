"""The regression corpus: one minimal trace per distinct (fault or finding, invariant)."""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from kvcheck.replay import replay, resolve_target
from kvcheck.trace import Provenance, Trace, load_trace

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def corpus_key(trace: Trace) -> tuple[str, str | None]:
    """What a trace is evidence of: its source (fault or finding) and the invariant it trips."""
    source = trace.provenance.source if trace.provenance else "unknown"
    return source, trace.expect.invariant if trace.expect else None


@attrs.define
class Corpus:
    folder: Path

    def paths(self) -> list[Path]:
        return sorted(self.folder.glob("*.json"))

    def traces(self) -> list[tuple[Path, Trace]]:
        return [(path, load_trace(path)) for path in self.paths()]

    def promote(self, trace: Trace, name: str, story: str, date: str) -> str:
        """Add ``trace`` as ``name``; returns what was done. Raises ValueError when it cannot be added."""
        if not NAME.match(name):
            raise ValueError(f"--name {name!r}: use letters, digits, '-' and '_'")
        if not story.strip():
            raise ValueError("--story is empty: say in one line what broke and why it matters")
        path = self.folder / f"{name}.json"
        if path.exists():
            raise ValueError(f"{path} exists already; choose another --name")
        fault = trace.expect.fault if trace.expect else None
        source = f"fault:{fault}" if fault else f"finding:{name}"
        expect = trace.expect if fault else None
        candidate = Trace(trace.config, trace.ops, expect, Provenance(source, date, story.strip()))
        clean = replay(candidate, resolve_target("kvcore"))
        if clean.violation is not None:
            raise ValueError(
                f"the trace does not replay clean on kvcore (step {clean.violation.step}: "
                f"{clean.violation.invariant}); fix kvcore first, the corpus holds passing traces"
            )
        if expect is not None:
            planted = replay(candidate, resolve_target("kvcore", fault))
            if planted.violation is None or planted.violation.invariant != expect.invariant:
                got = planted.violation.invariant if planted.violation else "no violation"
                raise ValueError(f"under fault {fault} the trace should fail with {expect.invariant}, got {got}")
        for existing_path, existing in self.traces():
            if expect is not None and corpus_key(existing) == corpus_key(candidate):
                shorter = len(candidate.ops) < len(existing.ops)
                return (
                    f"redundant: {existing_path.name} already shows {fault} caught by {expect.invariant} "
                    f"({len(existing.ops)} steps; this one has {len(candidate.ops)}"
                    + ("; shorter: replace the old file by hand if you prefer it)" if shorter else ")")
                )
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(candidate.dumps())
        return f"added {path} ({len(candidate.ops)} steps, {source})"
