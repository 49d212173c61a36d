"""The commands about the installed vLLM: doctor, and drift between releases."""

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
