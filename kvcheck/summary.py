"""A pytest plugin that ends `kvcheck run` with a readable summary."""

from __future__ import annotations

import time

import pytest

from kvcheck.lockstep import Lockstep
from kvcheck.vllm_releases import semantics_in_force


class SuiteSummary:
    """Collects each test's outcome and time, the steps driven and the coverage labels reached."""

    def __init__(self, target: str, fault: str | None, num_groups: int | None = None) -> None:
        self.target = target
        self.fault = fault
        self.num_groups = num_groups
        self.results: list[tuple[str, str, float]] = []
        self.started = time.perf_counter()
        self.steps_before = Lockstep.total_steps

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.results.append((report.nodeid, report.outcome, report.duration))

    def lines(self) -> list[str]:
        from kvcheck.coverage.labels import ALL_LABELS, GROUP_LAYOUTS, labels_required
        from kvcheck.coverage.tally import LABELS_SEEN

        seconds = time.perf_counter() - self.started
        steps = Lockstep.total_steps - self.steps_before
        under = f" with fault {self.fault}" if self.fault else ""
        semantics = semantics_in_force()
        out = ["", f"kvcheck summary: target {self.target}{under}", f"  {semantics.describe()}"]
        groups: dict[str, list[tuple[str, float]]] = {}
        for nodeid, outcome, duration in self.results:
            groups.setdefault(suite_file(nodeid.split("::")[0]), []).append((outcome, duration))
        width = max((len(name) for name in groups), default=10)
        for name, outcomes in groups.items():
            passed = sum(1 for o, _ in outcomes if o == "passed")
            failed = sum(1 for o, _ in outcomes if o == "failed")
            status = "ok" if not failed else "FAILED"
            spent = sum(d for _, d in outcomes)
            out.append(f"  {name:<{width}}  {status:<6}  {passed} passed, {failed} failed  {spent:6.1f}s")
        reachable = labels_required(GROUP_LAYOUTS if self.num_groups is None else (self.num_groups,))
        reached = [label for label in reachable if LABELS_SEEN[label]]
        out.append(f"  lockstep steps driven: {steps:,} in {seconds:.1f}s ({steps / max(seconds, 1e-9):,.0f}/s)")
        out.append(f"  coverage labels reached: {len(reached)}/{len(reachable)}")
        for label in ALL_LABELS:
            mark = "x" if LABELS_SEEN[label] else " " if label in reachable else "-"
            note = "" if label in reachable else ", unreachable with one group"
            out.append(f"    {mark} {label} ({LABELS_SEEN[label]}{note})")
        failed_tests = [nodeid for nodeid, outcome, _ in self.results if outcome == "failed"]
        verdict = "every invariant held" if not failed_tests else f"{len(failed_tests)} failing"
        out.append("  verdict: " + semantics.qualify(verdict))
        return out


def suite_file(path: str) -> str:
    """A suite file's name from its ``stateful_tests/`` or ``regressions/`` folder on, wherever the
    suite is installed."""
    for folder in ("stateful_tests/", "regressions/"):
        at = path.rfind(folder)
        if at >= 0:
            return path[at:]
    return path
