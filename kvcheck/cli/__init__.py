"""The kvcheck command: run the suite, replay and show traces, promote them, run the kill matrix, explore,
run campaigns on Ray, export traces as vLLM-only tests.

Exit codes: 0 success, 1 an invariant was violated (or a fault survived),
2 bad input (a malformed trace, an unknown target or fault, a value above its
limit in :mod:`kvmodel.limits`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kvcheck.cli.common import EXIT_BAD_INPUT, EXIT_OK, EXIT_VIOLATION, TARGET_HELP, default_corpus, suite_folder
from kvcheck.cli.search import (
    MAX_EXPLORE_DEPTH,
    cmd_campaign,
    cmd_explore,
    cmd_faults,
    cmd_kill_matrix,
)
from kvcheck.cli.suite import cmd_export, cmd_promote, cmd_replay, cmd_run, cmd_show
from kvcheck.cli.vllm import cmd_doctor, cmd_drift_compare, cmd_drift_record, cmd_scheduler
from kvmodel.limits import MAX_FULL_CHECK_EVERY, MAX_GROUPS, MAX_KILL_MATRIX_SEEDS, MAX_SEED, MAX_SWARM_RUNS

__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "EXIT_VIOLATION", "build_parser", "default_corpus", "main", "suite_folder"]


def build_parser() -> argparse.ArgumentParser:
    from kvcheck.scopes import FEATURES, LAYOUTS, SCOPES

    parser = argparse.ArgumentParser(prog="kvcheck", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def target_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--target", default="kvcore", help=TARGET_HELP)
        p.add_argument("--fault", default=None, help="plant a catalogued fault into kvcore (see `kvcheck faults`)")

    run = commands.add_parser("run", help="run the state machines and the regression corpus, with a summary")
    target_options(run)
    run.add_argument("--groups", type=int, default=None, help=f"fix the number of KV-cache groups (1 to {MAX_GROUPS})")
    run.add_argument("--profile", default=None, help="Hypothesis profile: dev, ci, thorough or smoke")
    run.add_argument(
        "--swarm-runs",
        type=int,
        default=2000,
        help=f"swarm driver runs after the machines (0: none; at most {MAX_SWARM_RUNS:,})",
    )
    run.add_argument("--seed", type=int, default=0, help=f"swarm driver seed (0 to {MAX_SEED})")
    run.add_argument(
        "--full-check-every",
        type=int,
        default=1,
        help=(
            "swarm driver: check the whole state every N steps and at the end of each run, only the step's "
            "results in between (and steps in flight); a violation is still reported exactly, by a replay "
            f"checked in full (default 1: every step; at most {MAX_FULL_CHECK_EVERY})"
        ),
    )
    run.set_defaults(func=cmd_run)

    rep = commands.add_parser("replay", help="replay traces, checking every invariant after every step")
    rep.add_argument("traces", nargs="+", metavar="TRACE")
    target_options(rep)
    rep.set_defaults(func=cmd_replay)

    show = commands.add_parser("show", help="render a trace step by step")
    show.add_argument("trace", metavar="TRACE")
    target_options(show)
    show.set_defaults(func=cmd_show)

    promote = commands.add_parser("promote", help="add a trace to the regression corpus")
    promote.add_argument("trace", metavar="FAILED_TRACE")
    promote.add_argument("--name", required=True, help="file name in the corpus (letters, digits, - and _)")
    promote.add_argument("--story", required=True, help="one line: what broke and why it matters")
    promote.add_argument(
        "--corpus",
        default=None,
        help="corpus folder (default: the shipped corpus, regressions/traces in a checkout)",
    )
    promote.set_defaults(func=cmd_promote)

    faults = commands.add_parser("faults", help="list the fault catalogue")
    faults.set_defaults(func=cmd_faults)

    matrix = commands.add_parser("kill-matrix", help="run every fault against the suite and tabulate the kills")
    matrix.add_argument("--target", default="kvcore", help="'kvcore' (default) or 'vllm'")
    matrix.add_argument("--faults", default=None, help="comma-separated subset of faults")
    matrix.add_argument(
        "--seeds", type=int, default=3, help=f"swarm seeds per fault (default 3, at most {MAX_KILL_MATRIX_SEEDS})"
    )
    matrix.add_argument(
        "--runs", type=int, default=3000, help=f"swarm runs per seed (default 3000, at most {MAX_SWARM_RUNS:,})"
    )
    matrix.add_argument("--json", default="kill-matrix.json", help="where to write the results as JSON")
    matrix.add_argument("--traces", default="repros/kill-matrix", help="where to write the shrunk traces")
    matrix.set_defaults(func=cmd_kill_matrix)

    explore = commands.add_parser(
        "explore", help="try every operation sequence of a small scope up to a depth, breadth first"
    )
    target_options(explore)
    explore.add_argument(
        "--scope", default="ci", help="named scope to start from: " + " or ".join(SCOPES) + " (default ci)"
    )
    explore.add_argument("--depth", type=int, default=None, help=f"operations per sequence (1 to {MAX_EXPLORE_DEPTH})")
    explore.add_argument("--blocks", type=int, default=None, help="usable blocks in the pool (besides the null block)")
    explore.add_argument("--block-sizes", default=None, help="comma-separated block sizes, e.g. 1,2")
    explore.add_argument("--layouts", default=None, help="comma-separated group layouts: " + ", ".join(LAYOUTS))
    explore.add_argument("--caching", default=None, help="on, off or both")
    explore.add_argument(
        "--features", default=None, help="comma-separated drafter/async features: " + ", ".join(FEATURES)
    )
    explore.add_argument("--alphabet", type=int, default=None, help="token ids in prompts (0 to N-1)")
    explore.add_argument("--reach", type=int, default=None, help="blocks a local group's window or chunk spans (2)")
    explore.add_argument("--prompt-lengths", default=None, help="comma-separated prompt lengths, e.g. 1,2,3")
    explore.add_argument("--max-requests", type=int, default=None, help="live requests at most")
    explore.add_argument("--schedule-sizes", default=None, help="comma-separated tokens per schedule, e.g. 1,2")
    explore.add_argument(
        "--seconds", type=float, default=None, help="stop after this long (the scope is then not exhausted)"
    )
    explore.add_argument("--repros", default="repros", help="where a counterexample's trace and test are written")
    explore.set_defaults(func=cmd_explore)

    campaign = commands.add_parser(
        "campaign", help="search for a time budget with swarm, machine and explorer shards run on Ray"
    )
    target_options(campaign)
    campaign.add_argument("--minutes", type=float, default=10.0, help="time budget in minutes (default 10)")
    campaign.add_argument(
        "--address", default=None, help="join the Ray cluster at this address (default: start Ray on this machine)"
    )
    campaign.add_argument(
        "--workers", type=int, default=None, help="shards run at once (default: the CPUs of this machine or cluster)"
    )
    campaign.add_argument(
        "--groups", type=int, default=None, help=f"fix the number of KV-cache groups (1 to {MAX_GROUPS})"
    )
    campaign.add_argument("--seed", type=int, default=0, help=f"first swarm and Hypothesis seed (0 to {MAX_SEED})")
    campaign.add_argument("--repros", default="repros", help="where each distinct failure's trace and test are written")
    campaign.add_argument(
        "--database",
        default=None,
        help="keep the machine shards' Hypothesis example database in this folder (default: a temporary one)",
    )
    campaign.add_argument(
        "--full-check-every",
        type=int,
        default=1,
        help=f"swarm shards check the whole state every N steps, as `kvcheck run` does (1 to {MAX_FULL_CHECK_EVERY})",
    )
    campaign.set_defaults(func=cmd_campaign)

    export = commands.add_parser(
        "export", help="write a trace as a standalone pytest file for vLLM (imports vLLM only, not kvcheck)"
    )
    export.add_argument("trace", metavar="TRACE")
    export.add_argument(
        "-o", "--output", default=None, help="where to write it (default: test_<trace stem>_vllm.py in this folder)"
    )
    export.set_defaults(func=cmd_export)

    doctor = commands.add_parser(
        "doctor",
        help="what vLLM is installed, which release's semantics kvcheck follows, and which known defects it shows",
    )
    doctor.set_defaults(func=cmd_doctor)

    scheduler = commands.add_parser(
        "scheduler",
        help="random workloads through vLLM's own scheduler, every allocator call it makes checked (needs vLLM)",
    )
    scheduler.add_argument("--runs", type=int, default=200, help=f"workloads to run (1 to {MAX_SWARM_RUNS:,})")
    scheduler.add_argument("--seed", type=int, default=0, help=f"the workloads' seed (0 to {MAX_SEED})")
    scheduler.add_argument(
        "--fault", default=None, help="plant a fault expressed against vLLM into the scheduler's own manager"
    )
    scheduler.add_argument(
        "--trace-out",
        default="kvcheck-scheduler-failure.json",
        help="where a failure's shrunk calls are written as a trace (default: kvcheck-scheduler-failure.json)",
    )
    scheduler.set_defaults(func=cmd_scheduler)

    drift = commands.add_parser(
        "drift", help="record the installed vLLM's outcomes on fixed runs, or diff two releases' recordings"
    )
    drift_commands = drift.add_subparsers(dest="drift_command", required=True)
    drift_record = drift_commands.add_parser(
        "record", help="drive the installed vLLM through the corpus and a fixed swarm"
    )
    drift_record.add_argument("output", metavar="FILE")
    drift_record.add_argument("--seed", type=int, default=0, help="the swarm's seed (default 0)")
    drift_record.add_argument(
        "--swarm-runs", type=int, default=200, help=f"swarm runs recorded besides the corpus (0 to {MAX_SWARM_RUNS})"
    )
    drift_record.add_argument(
        "--semantics",
        default=None,
        help="the release whose scheduler calls drive every release (default: the oldest kvcheck knows)",
    )
    drift_record.set_defaults(func=cmd_drift_record)
    drift_compare = drift_commands.add_parser("compare", help="each run's first step that differs between two files")
    drift_compare.add_argument("first", metavar="FILE")
    drift_compare.add_argument("second", metavar="FILE")
    drift_compare.set_defaults(func=cmd_drift_compare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
