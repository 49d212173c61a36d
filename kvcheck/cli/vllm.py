"""The commands about the installed vLLM: doctor, drift between releases, and its own scheduler driven by workloads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from kvcheck.vllm_releases import semantics_in_force
from kvmodel.limits import (
    MAX_SEED,
    MAX_SWARM_RUNS,
)

if TYPE_CHECKING:
    pass
from kvcheck.cli.common import (
    EXIT_OK,
    EXIT_VIOLATION,
    bad_input,
    default_corpus,
    out_of_range,
)

# -- doctor -----------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print the installed vLLM, the semantics followed, the behaviour table on them, what is driven,
    and each known defect's standing on the installed release."""
    from kvcheck.known_defects import DEFECTS, defect_status
    from kvcheck.targets.vllm_target import VllmUnavailable, require_vllm
    from kvcheck.vllm_releases import installed_vllm
    from kvmodel.kinds import GROUP_KINDS
    from kvmodel.semantics import BEHAVIOURS, KNOWN_VERSIONS, NEWEST

    semantics = semantics_in_force()
    found = installed_vllm()
    print(f"kvcheck knows vLLM {', '.join(KNOWN_VERSIONS)}; kvcore follows {NEWEST}")
    print(f"installed: {'vLLM not installed' if found is None else f'vLLM {found[0]} at {found[1]}'}")
    print(f"semantics: {semantics.describe()}")
    print("behaviours (kvcheck/vllm_releases.py):")
    for row in BEHAVIOURS:
        mark = "x" if semantics.has(row.name) else " "
        source = row.sources.get(semantics.release, "absent")
        print(f"  [{mark}] {row.name} (since {row.since}; {source})")
    print(f"driven: every group kind ({', '.join(GROUP_KINDS)}) and feature, the same on every known release")
    try:
        require_vllm()
    except VllmUnavailable as exc:
        print(f"known defects: not checked ({exc})")
        return EXIT_OK
    print("known defects (kvcheck/known_defects.py), on the installed release:")
    confirmed = semantics.unconfirmed is None
    for defect in DEFECTS:
        print(f"  {defect.name}: {defect_status(defect, semantics.release, confirmed)}")
    return EXIT_OK


# -- drift ------------------------------------------------------------------------


def cmd_drift_record(args: argparse.Namespace) -> int:
    from kvcheck.drift import record
    from kvcheck.targets.vllm_target import VllmUnavailable, require_vllm
    from kvmodel.semantics import KNOWN_VERSIONS

    semantics = args.semantics or KNOWN_VERSIONS[0]
    refusal = out_of_range([("--swarm-runs", args.swarm_runs, 0, MAX_SWARM_RUNS), ("--seed", args.seed, 0, MAX_SEED)])
    if refusal is not None:
        return bad_input(refusal)
    if semantics not in KNOWN_VERSIONS:
        return bad_input(f"--semantics: {semantics!r} is not a known vLLM release ({', '.join(KNOWN_VERSIONS)})")
    try:
        require_vllm()
    except VllmUnavailable as exc:
        return bad_input(f"drift record: {exc}")
    document = record(default_corpus().glob("*.json"), args.seed, args.swarm_runs, semantics)
    output = Path(args.output)
    try:
        output.write_text(json.dumps(document) + "\n")
    except OSError as exc:
        return bad_input(f"{output}: cannot write the drift file: {exc.strerror or exc}")
    steps = sum(len(run["steps"]) for run in document["runs"])
    print(f"{output}: vLLM {document['vllm']}, {len(document['runs'])} runs, {steps} steps, {semantics}'s calls")
    return EXIT_OK


def cmd_drift_compare(args: argparse.Namespace) -> int:
    from kvcheck.drift import DriftFileError, compare, read

    try:
        first, second = read(Path(args.first)), read(Path(args.second))
        drifts = compare(first, second)
    except DriftFileError as exc:
        return bad_input(str(exc))
    versions = f"vLLM {first['vllm']} and vLLM {second['vllm']}"
    if not drifts:
        print(f"{versions}: {len(first['runs'])} runs alike, step by step, on {first['semantics']}'s calls")
        return EXIT_OK
    counts = f"{len(drifts)} of {len(first['runs'])} runs differ"
    print(f"{versions}: {counts} (each a row of kvcheck/vllm_releases.py or a finding):")
    for drift in drifts:
        print(f"  {drift}")
    return EXIT_VIOLATION


# -- vLLM's own scheduler ---------------------------------------------------------


def cmd_scheduler(args: argparse.Namespace) -> int:
    """Random workloads through vLLM's own scheduler, every allocator call it makes checked against the
    model; a failure is shrunk, printed, and written as a trace of those calls."""
    import datetime

    from kvcheck.faults import VLLM_FAULTS
    from kvcheck.targets.vllm_target import VllmUnavailable, require_vllm
    from kvcheck.trace import Expectation, Provenance, Trace
    from kvcheck.vllm_scheduler.search import search
    from kvmodel.ops import describe_op

    refusal = out_of_range([("--runs", args.runs, 1, MAX_SWARM_RUNS), ("--seed", args.seed, 0, MAX_SEED)])
    if refusal is not None:
        return bad_input(refusal)
    folder = Path(args.trace_out).parent
    if not folder.is_dir():
        return bad_input(f"--trace-out: {args.trace_out}: the folder {folder} does not exist")
    if args.fault is not None and args.fault not in VLLM_FAULTS:
        return bad_input(f"--fault: {args.fault!r} is not expressed against vLLM; these are: {', '.join(VLLM_FAULTS)}")
    try:
        v = require_vllm()
    except VllmUnavailable as exc:
        return bad_input(f"scheduler: {exc}")
    plant = VLLM_FAULTS[args.fault].plant if args.fault else None
    report = search(seed=args.seed, max_runs=args.runs, plant=plant, check_imitation=plant is None)
    planted = f", fault {args.fault} planted" if args.fault else ""
    print(
        f"vLLM {v.version}'s Scheduler (synchronous, first come first served{planted}): {report.runs:,} workloads "
        f"from seed {args.seed}, {report.steps:,} engine steps, {report.operations:,} allocator calls checked "
        f"({report.preemptions:,} preemptions; {report.stalled:,} runs stalled with requests that never fit), "
        f"{report.seconds:.1f} s"
    )
    if report.imitation_gap is not None:
        case, gap = report.imitation_gap
        print(f"every invariant held, but kvcheck's own scheduler does not make vLLM's calls: {gap}")
        print(f"config: {case.config.describe()}; scheduler: {case.settings}; workload: {case.workload}")
        return EXIT_VIOLATION
    if report.shrunk is None:
        imitated = "; kvcheck's own scheduler made the same calls on every run" if plant is None else ""
        print(f"every invariant held{imitated}")
        return EXIT_OK
    failure = report.shrunk
    case = failure.case
    print(f"FAILED: {failure.violation}")
    assert report.failure is not None
    print(f"shrunk from {len(report.failure.record.ops)} to {len(failure.record.ops)} operations")
    print(f"config: {case.config.describe()}")
    print(f"scheduler: {case.settings}")
    for arrival in case.workload.arrivals:
        prompt, outputs = list(arrival.prompt), list(arrival.outputs)
        print(f"  step {arrival.step}: {arrival.request_id} arrives, prompt {prompt}, samples {outputs}")
    for abort in case.workload.aborts:
        print(f"  step {abort.step}: {abort.request_id} aborted")
    print("the scheduler's allocator calls, as operations:")
    for position, op in enumerate(failure.record.ops, start=1):
        print(f"  {position:3d} {describe_op(op)}")
    story = (
        f"vLLM {v.version}'s scheduler on a workload ({len(case.workload.arrivals)} requests, budget "
        f"{case.settings.max_num_batched_tokens} tokens, {case.settings.max_num_seqs} requests a step); "
        f"its allocator calls as operations"
    )
    trace = Trace(
        case.config,
        failure.record.ops,
        Expectation(failure.violation.invariant, args.fault),
        Provenance(f"vllm-scheduler:seed {args.seed}", datetime.date.today().isoformat(), story),
    )
    output = Path(args.trace_out)
    try:
        output.write_text(trace.dumps())
    except OSError as exc:
        return bad_input(f"{output}: cannot write the trace: {exc.strerror or exc}")
    print(
        f"written to {output} (`kvcheck replay {output} --target vllm` replays the calls through kvcheck's scheduler)"
    )
    return EXIT_VIOLATION
