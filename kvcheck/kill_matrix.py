"""The kill matrix: every catalogued fault against the suite, under a fixed budget.

For each fault the swarm driver (the manager machine's operations, model and
invariants, at full speed) runs from fixed seeds until it has seen a few
failures or spent its budget; each failure is shrunk and the shortest kept.
Budgets are counted in runs, not seconds, so the matrix is deterministic.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path

import attrs

from kvcheck.faults import FAULTS, VLLM_FAULTS, Fault, vllm_target_with
from kvcheck.shrink import shrink
from kvcheck.swarm import Failure, swarm
from kvcheck.targets import TargetFactory
from kvcheck.trace import Expectation, Provenance, Trace


@attrs.frozen
class KillBudget:
    seeds: tuple[int, ...] = (0, 1, 2)
    runs_per_seed: int = 3000
    failures_wanted: int = 3


@attrs.define
class KillResult:
    fault: str
    description: str
    killed: bool
    invariant: str | None = None
    runs_to_first_failure: int | None = None
    first_seed: int | None = None
    """The budget's first seed whose swarm found the fault (every seed before it ran its runs clean)."""
    seconds_to_first_failure: float | None = None
    shrunk_steps: int | None = None
    shrunk: Failure | None = None
    trace_path: str | None = None

    def to_json(self) -> dict[str, object]:
        fields = attrs.asdict(self, filter=lambda a, _: a.name != "shrunk")
        return fields


def kill(fault: Fault, budget: KillBudget, make_target: TargetFactory | None = None) -> KillResult:
    """Hunt ``fault`` with the swarm driver and shrink what it finds.

    ``make_target`` builds the faulty target (default: kvcore with the fault planted).
    """
    make_target = make_target or fault.kvcore_target
    result = KillResult(fault.name, fault.description, killed=False)
    runs_before = 0
    seconds_before = 0.0
    best: Failure | None = None
    found = 0
    for seed in budget.seeds:
        report = swarm(make_target, seed=seed, max_runs=budget.runs_per_seed)
        if report.failure is None:
            runs_before += report.runs
            seconds_before += report.seconds
            continue
        if result.runs_to_first_failure is None:
            result.runs_to_first_failure = runs_before + report.runs
            result.first_seed = seed
            result.seconds_to_first_failure = round(seconds_before + report.seconds, 2)
        shrunk = shrink(make_target, report.failure)
        if best is None or len(shrunk.ops) < len(best.ops):
            best = shrunk
        found += 1
        if found >= budget.failures_wanted:
            break
    if best is not None:
        result.killed = True
        result.invariant = best.violation.invariant
        result.shrunk_steps = len(best.ops)
        result.shrunk = best
    return result


def shrunk_trace(result: KillResult) -> Trace:
    assert result.shrunk is not None and result.invariant is not None
    return Trace(
        result.shrunk.config,
        result.shrunk.ops,
        Expectation(result.invariant, result.fault),
        Provenance(f"fault:{result.fault}", datetime.date.today().isoformat(), result.description),
    )


def kill_matrix(
    faults: Iterable[str] | None = None,
    budget: KillBudget = KillBudget(),
    traces_dir: Path | None = None,
    target: str = "kvcore",
) -> list[KillResult]:
    """Kill every named fault; ``target`` is 'kvcore' (every fault) or 'vllm' (the faults expressed against it)."""
    catalogue = FAULTS
    if target == "vllm":
        catalogue = VLLM_FAULTS
    results = []
    for name in faults or catalogue:
        make_target = vllm_target_with(name) if target == "vllm" else None
        result = kill(catalogue[name], budget, make_target)
        if result.killed and traces_dir is not None:
            traces_dir.mkdir(parents=True, exist_ok=True)
            path = traces_dir / f"{name}.json"
            path.write_text(shrunk_trace(result).dumps())
            result.trace_path = str(path)
        results.append(result)
    return results


def format_table(results: list[KillResult]) -> list[str]:
    header = ("fault", "killed by", "runs", "seconds", "shrunk steps")
    rows = [
        (
            r.fault,
            r.invariant or "NOT KILLED",
            str(r.runs_to_first_failure or "-"),
            f"{r.seconds_to_first_failure:.2f}" if r.seconds_to_first_failure is not None else "-",
            str(r.shrunk_steps or "-"),
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    return lines
