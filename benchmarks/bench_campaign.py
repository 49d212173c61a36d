"""Steps per second of ``kvcheck campaign`` with 1 and with 2 workers: the same campaign (target,
seed, budget), on Ray started on this machine, once per worker count.

Each run starts its own Ray (``num_cpus`` the workers) and counts the lockstep steps every shard
drove (shrinking left out) over the campaign's wall-clock time, Ray's start-up left out and the
workers' first imports included.  Shards of the three kinds are submitted in turn, so both runs
drive the same mix of swarm, machine and explorer shards.  Ray runs its workers at niceness 15, so
on a shared machine any other busy process takes a core from them first: run it on a quiet
machine, with ``--repeats`` (the runs alternate between worker counts and the best is kept).
It needs Ray (``pip install 'kvcheck[campaign]'``).  Usage, from the repository root:

    python benchmarks/bench_campaign.py [--minutes 1] [--workers 1,2] [--repeats 2] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attrs
from measurement import recorded_output

from kvcheck.campaign import RAY_MISSING, SHARD_KINDS, import_ray, run_campaign


@attrs.frozen
class Row:
    """One campaign's figures."""

    workers: int
    shards: dict[str, int]
    steps: int
    seconds: float
    clean: bool

    @property
    def steps_per_second(self) -> float:
        return self.steps / max(self.seconds, 1e-9)


def measure(ray: object, workers: int, minutes: float, seed: int) -> Row:
    """One campaign on ``workers`` workers (its status lines discarded)."""
    with tempfile.TemporaryDirectory() as repros:
        report = run_campaign(ray, minutes=minutes, workers=workers, seed=seed, repros=Path(repros), out=io.StringIO())
    shards = {kind: report.kinds[kind].shards for kind in SHARD_KINDS}
    return Row(workers, shards, report.steps, report.seconds, report.clean)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="budget of each campaign (default 1)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=1, help="campaigns per worker count, alternated; the best is kept (default 1)"
    )
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--write", default=None, help="also write the table as Markdown to this file")
    args = parser.parse_args()
    ray = import_ray()
    if ray is None:
        print(RAY_MISSING, file=sys.stderr)
        return 2
    counts = [int(item) for item in args.workers.split(",")]
    best: dict[int, Row] = {}
    for workers in counts * args.repeats:
        row = measure(ray, workers, args.minutes, args.seed)
        print(f"  {workers} worker(s): {row.steps_per_second:,.0f} steps/s", flush=True)
        if workers not in best or row.steps_per_second > best[workers].steps_per_second:
            best[workers] = row
    rows = [best[workers] for workers in counts]
    with recorded_output(args.write, "Campaign throughput by worker count", "bench_campaign.py"):
        print_rows(args, rows)
    if args.json:
        figures = [{**attrs.asdict(row), "steps_per_second": round(row.steps_per_second)} for row in rows]
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if all(row.clean for row in rows) else 1


def print_rows(args: argparse.Namespace, rows: list[Row]) -> None:
    print(f"kvcheck campaign, {args.minutes:g} min per run, seed {args.seed}, target kvcore, {os.cpu_count()} CPUs")
    print(f"{'workers':>7}  {'shards swarm/machine/explore':>28}  {'steps':>10}  {'seconds':>7}  {'steps/s':>8}")
    for row in rows:
        shards = "/".join(map(str, row.shards.values()))
        print(f"{row.workers:>7}  {shards:>28}  {row.steps:>10,}  {row.seconds:>7.1f}  {row.steps_per_second:>8,.0f}")
    for row in rows[1:]:
        ratio = row.steps_per_second / max(rows[0].steps_per_second, 1e-9)
        print(f"{row.workers} workers / {rows[0].workers}: {ratio:.2f}x steps/s")


if __name__ == "__main__":
    raise SystemExit(main())
