"""The campaign driver: keeps every worker busy until the budget is spent, redraws the status line,
and sums up what the shards found."""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

import attrs

from kvcheck.campaign.findings import MAX_REPROS_PER_INVARIANT, DistinctFailure, FailureBook, InvariantFailures
from kvcheck.campaign.shards import (
    REPORT_SECONDS,
    SHARD_KINDS,
    ProgressBoard,
    ShardOptions,
    ShardResult,
    ShardSpec,
    ray_shard,
    shard_plan,
)

PLAIN_STATUS_SECONDS = 10.0
"""How often a status line is printed when the output is not a terminal."""


@attrs.define
class KindTotals:
    shards: int = 0
    steps: int = 0
    runs: int = 0
    exhausted: int = 0
    cut_short: int = 0
    seconds: float = 0.0


@attrs.define
class CampaignReport:
    """What a campaign did and found."""

    target: str
    fault: str | None
    workers: int
    budget_seconds: float
    seed: int
    seconds: float = 0.0
    kinds: dict[str, KindTotals] = attrs.Factory(lambda: {kind: KindTotals() for kind in SHARD_KINDS})
    labels: Counter[str] = attrs.Factory(Counter)
    nodes: set[str] = attrs.Factory(set)
    failures: list[InvariantFailures] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    skipped: int = 0
    interrupted: bool = False
    database: str | None = None
    """The Hypothesis example database folder, when it is kept."""

    @property
    def shards(self) -> int:
        return sum(totals.shards for totals in self.kinds.values())

    @property
    def steps(self) -> int:
        return sum(totals.steps for totals in self.kinds.values())

    @property
    def findings(self) -> int:
        return sum(group.findings for group in self.failures)

    @property
    def distinct(self) -> int:
        return sum(len(group.distinct) for group in self.failures)

    @property
    def clean(self) -> bool:
        return not self.failures and not self.errors

    def absorb(self, result: ShardResult) -> None:
        """Count a finished shard (its findings are the failure book's)."""
        if result.skipped:
            self.skipped += 1
            return
        totals = self.kinds[result.spec.kind]
        totals.shards += 1
        totals.steps += result.steps
        totals.runs += result.runs
        totals.seconds += result.seconds
        if result.spec.kind == "explore" and result.error is None:
            if result.exhausted:
                totals.exhausted += 1
            elif not result.findings:
                totals.cut_short += 1
        self.labels.update(result.labels)
        if result.node:
            self.nodes.add(result.node)
        if result.error is not None:
            self.errors.append(result.error)


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Campaign:
    """Submits shards to Ray until the budget is spent, and keeps the status line and the failures."""

    def __init__(
        self,
        ray: Any,
        options: ShardOptions,
        *,
        workers: int,
        budget_seconds: float,
        seed: int,
        repros: Path,
        out: TextIO = sys.stdout,
    ) -> None:
        self.ray = ray
        self.options = options
        self.workers = workers
        self.budget = budget_seconds
        self.repros = repros
        self.out = out
        self.tty = out.isatty()
        self.book = FailureBook()
        self.report = CampaignReport(options.target, options.fault, workers, budget_seconds, seed)
        self.plan = shard_plan(seed, options.num_groups)
        self.in_flight: dict[Any, ShardSpec] = {}
        self.live: dict[int, tuple[int, dict[str, int]]] = {}
        self.started = 0.0
        self.last_status = 0.0
        self.status_width = 0

    def run(self) -> CampaignReport:
        ray = self.ray
        remote_shard = ray.remote(num_cpus=1, max_retries=1)(ray_shard)
        board = ray.remote(num_cpus=0)(ProgressBoard).remote()
        self.started = time.monotonic()
        end = self.started + self.budget
        self.options = attrs.evolve(self.options, deadline=time.time() + self.budget)
        capacity = self.workers + 1  # one queued, so that no worker waits for the driver
        try:
            while True:
                while time.monotonic() < end and len(self.in_flight) < capacity:
                    spec = next(self.plan)
                    # The first shard of each kind runs whole, however short the budget.
                    options = self.options if spec.number else attrs.evolve(self.options, deadline=float("inf"))
                    self.in_flight[remote_shard.remote(spec, options, board)] = spec
                if not self.in_flight:
                    break
                ready, _ = ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=0.25)
                for ref in ready:
                    self._finished(self._result(ref, self.in_flight.pop(ref)))
                self._status(board)
        except KeyboardInterrupt:
            self.report.interrupted = True
            for ref in self.in_flight:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
        self._status(board, final=True)
        self.report.seconds = time.monotonic() - self.started
        self.report.failures = list(self.book.invariants.values())
        return self.report

    def _result(self, ref: Any, spec: ShardSpec) -> ShardResult:
        try:
            result: ShardResult = self.ray.get(ref)
        except Exception as exc:  # the worker died (the shard itself returns its exceptions)
            return ShardResult(spec, error=f"{spec.describe()} failed as a Ray task: {type(exc).__name__}: {exc}")
        return result

    def _finished(self, result: ShardResult) -> None:
        self.report.absorb(result)
        self.live.pop(result.spec.key, None)
        for finding in result.findings:
            failure = self.book.add(finding)
            if failure is not None and failure.number <= MAX_REPROS_PER_INVARIANT:
                self._write(failure)
        if result.error is not None:
            self._say(f"shard error: {result.error.splitlines()[0]}")

    def _write(self, failure: DistinctFailure) -> None:
        from kvcheck.repro import write_repro

        stem = f"campaign-{failure.invariant}-{failure.number}"
        failure.json_path, failure.py_path = write_repro(failure.trace, self.repros, stem, self.options.target)
        if failure.number == 1:
            self._say(
                f"{failure.invariant} violated ({len(failure.trace.ops)} steps), found by {failure.found_by}: "
                f"{failure.json_path}"
            )

    def _say(self, line: str) -> None:
        """A line above the status line."""
        if self.tty and self.status_width:
            self.out.write("\r\x1b[K")
            self.status_width = 0
        self.out.write(line + "\n")
        self.out.flush()

    def _status(self, board: Any, final: bool = False) -> None:
        now = time.monotonic()
        interval = REPORT_SECONDS if self.tty else PLAIN_STATUS_SECONDS
        if not final and now - self.last_status < interval:
            return
        self.last_status = now
        keys = sorted(spec.key for spec in self.in_flight.values())
        if not final:
            with contextlib.suppress(Exception):  # a slow board only delays the live figures
                self.live = self.ray.get(board.snapshot.remote(keys), timeout=2.0)
        line = self.status_line(now, keys)
        if self.tty:
            self.out.write("\r\x1b[K" + line + ("\n" if final else ""))
            self.status_width = 0 if final else len(line)
        elif not final:
            self.out.write(line + "\n")
        self.out.flush()

    def status_line(self, now: float, running: list[int]) -> str:
        from kvcheck.coverage.labels import ALL_LABELS

        elapsed = now - self.started
        live = {key: self.live[key] for key in running if key in self.live}
        steps = self.report.steps + sum(steps for steps, _ in live.values())
        labels = set(self.report.labels)
        for _, shard_labels in live.values():
            labels.update(shard_labels)
        left = self.budget - elapsed
        if left > 0:
            timing = f"{_clock(left)} left"
        else:
            timing = f"finishing {len(running)} shard{plural_s(len(running))}" if running else "budget spent"
        count = len(self.book.invariants)
        failures = str(count)
        if count:
            failures += f" invariant{plural_s(count)} ({self.book.distinct} traces, {self.book.findings} findings)"
        return (
            f"{_clock(elapsed)} elapsed, {timing} | shards {self.report.shards} done, {len(running)} running | "
            f"{steps:,} steps, {steps / max(elapsed, 1e-9):,.0f} steps/s | "
            f"labels {len(labels & set(ALL_LABELS))}/{len(ALL_LABELS)} | failures {failures}"
        )


def plural_s(count: int) -> str:
    return "" if count == 1 else "s"


def summary_lines(report: CampaignReport) -> list[str]:
    """The campaign's summary, as ``kvcheck run`` ends with its own."""
    from kvcheck.coverage.labels import ALL_LABELS

    under = f" with fault {report.fault}" if report.fault else ""
    nodes = f" on {len(report.nodes)} node{plural_s(len(report.nodes))}" if report.nodes else ""
    out = [
        "",
        f"kvcheck campaign summary: target {report.target}{under}, {report.workers} workers{nodes}, "
        f"budget {report.budget_seconds / 60:g} min, seed {report.seed}",
    ]
    by_kind = ", ".join(f"{kind} {totals.shards}" for kind, totals in report.kinds.items())
    out.append(f"  shards: {report.shards} ({by_kind})")
    units = {"swarm": "runs", "machine": "examples", "explore": "operations checked"}
    for kind, totals in report.kinds.items():
        line = f"    {kind:<8} {totals.shards:>5} shards  {totals.steps:>12,} steps  {totals.runs:>10,} {units[kind]}"
        if kind == "explore" and totals.shards:
            line += (
                f"; {totals.exhausted} configuration{plural_s(totals.exhausted)} exhausted, "
                f"{totals.cut_short} cut short by the budget"
            )
        out.append(line)
    seconds = max(report.seconds, 1e-9)
    out.append(f"  lockstep steps driven: {report.steps:,} in {report.seconds:.1f}s ({report.steps / seconds:,.0f}/s)")
    reached = [label for label in ALL_LABELS if report.labels[label]]
    out.append(f"  coverage labels reached (machine shards): {len(reached)}/{len(ALL_LABELS)}")
    for label in ALL_LABELS:
        out.append(f"    {'x' if report.labels[label] else ' '} {label} ({report.labels[label]})")
    if report.database:
        out.append(f"  Hypothesis example database: {report.database}")
    flag = f" --fault {report.fault}" if report.fault else ""
    for group in report.failures:
        shortest = group.shortest
        traces = len(group.distinct)
        out.append(
            f"  {group.invariant} violated: {group.findings} finding{plural_s(group.findings)} by {len(group.shards)} "
            f"shard{plural_s(len(group.shards))}, {traces} distinct shrunk trace{plural_s(traces)}"
        )
        out.append(f"    {shortest.message}".replace("\n", "\n    "))
        out.append(
            f"    shortest repro ({len(shortest.trace.ops)} steps): {shortest.json_path}; test: {shortest.py_path}"
        )
        out.append(f"    replay: kvcheck replay {shortest.json_path}{flag}")
        if traces > 1:
            out.append("    every distinct trace:")
            for failure in group.written:
                out.append(
                    f"      {failure.json_path} ({len(failure.trace.ops)} steps, found {failure.findings} "
                    f"time{plural_s(failure.findings)}, first by {failure.found_by})"
                )
            unwritten = traces - len(group.written)
            if unwritten:
                out.append(
                    f"      and {unwritten} more, not written (at most {MAX_REPROS_PER_INVARIANT} per invariant)"
                )
    for error in report.errors:
        out.append("  shard error: " + error.replace("\n", "\n    "))
    if report.interrupted:
        out.append("  interrupted: the shards still running were cancelled")
    if report.clean:
        verdict = "every invariant held"
    else:
        parts = []
        if report.failures:
            count = len(report.failures)
            parts.append(
                f"{count} invariant{plural_s(count)} violated "
                f"({report.distinct} distinct shrunk trace{plural_s(report.distinct)}, "
                f"{report.findings} finding{plural_s(report.findings)})"
            )
        if report.errors:
            parts.append(f"{len(report.errors)} shard error{plural_s(len(report.errors))}")
        verdict = ", ".join(parts)
    out.append(f"  verdict: {verdict}")
    return out
