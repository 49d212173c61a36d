"""The failures a campaign's shards report, deduplicated by invariant and shrunk operations."""

from __future__ import annotations

from pathlib import Path

import attrs

from kvcheck.campaign.shards import Finding
from kvcheck.trace import Trace

MAX_REPROS_PER_INVARIANT = 20
"""Distinct failures of one invariant written out; further ones are counted only (a planted fault
shrinks to a new handful of operations every few runs, which a long campaign would write by the thousand)."""


@attrs.define
class DistinctFailure:
    """A distinct failure: an invariant and the shrunk operations that violate it, with its repro files."""

    invariant: str
    number: int
    """Its number among its invariant's distinct failures, from 1."""
    message: str
    trace: Trace
    found_by: str
    findings: int = 0
    json_path: Path | None = None
    py_path: Path | None = None

    @property
    def size(self) -> tuple[int, int]:
        """Steps first, then the operations' length as text: what makes a repro quicker to read."""
        return len(self.trace.ops), len(repr(self.trace.ops))


@attrs.define
class InvariantFailures:
    """The distinct failures of one invariant, and how often and by how many shards it was found."""

    invariant: str
    distinct: list[DistinctFailure] = attrs.Factory(list)
    shards: set[int] = attrs.Factory(set)
    findings: int = 0

    @property
    def written(self) -> list[DistinctFailure]:
        return [failure for failure in self.distinct if failure.json_path is not None]

    @property
    def shortest(self) -> DistinctFailure:
        """The smallest written repro (the first distinct failure when none is written yet)."""
        return min(self.written or self.distinct[:1], key=lambda failure: failure.size)


class FailureBook:
    """The failures of a campaign, deduplicated by invariant and shrunk operations, grouped by invariant.

    The shrinker stops at a local minimum, so runs that find one bug often shrink to different
    operations (one run's request is freed, another's preempted, a third's window slides); the
    summary therefore reports each violated invariant once, with its shortest repro, and lists the
    distinct traces under it."""

    def __init__(self) -> None:
        self.invariants: dict[str, InvariantFailures] = {}
        self._known: dict[tuple[str, tuple[object, ...]], DistinctFailure] = {}

    @property
    def distinct(self) -> int:
        return sum(len(group.distinct) for group in self.invariants.values())

    @property
    def findings(self) -> int:
        return sum(group.findings for group in self.invariants.values())

    def add(self, finding: Finding) -> DistinctFailure | None:
        """Record a finding; returns its distinct failure when it is a new one."""
        from kvcheck.trace import parse_trace

        group = self.invariants.setdefault(finding.invariant, InvariantFailures(finding.invariant))
        group.findings += finding.times
        group.shards.add(finding.shard)
        trace = parse_trace(finding.trace_text, finding.found_by)
        key = (finding.invariant, trace.ops)
        known = self._known.get(key)
        if known is not None:
            known.findings += finding.times
            return None
        failure = DistinctFailure(
            finding.invariant, len(group.distinct) + 1, finding.message, trace, finding.found_by, finding.times
        )
        group.distinct.append(failure)
        self._known[key] = failure
        return failure
