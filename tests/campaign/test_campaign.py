"""``kvcheck campaign`` on a two-node Ray cluster started here: a clean campaign, and one with a
planted fault that many shards find, reported once and written out as a repro that replays failing.

The assertions hold however fast the machine is: the first shard of each kind runs whole whatever
the budget, and with a fixed seed those first shards search the same runs every time.
"""

from __future__ import annotations

import re
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from ray.cluster_utils import Cluster

from kvcheck.campaign import WORKER_NICENESS, FailureBook, Finding, ShardOptions, run_shard, shard_plan
from kvcheck.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_VIOLATION, main
from kvcheck.coverage.labels import ALL_LABELS
from kvcheck.replay import replay, resolve_target
from kvcheck.trace import load_trace

FAULT = "fifo-reuse-when-caching-off"
INVARIANT = "lifo_head_reuse_when_caching_off"
NODE_MEMORY = 100 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two Ray nodes of one CPU each, on this machine, their workers at the priority of the tests
    (not Ray's niceness 15, which leaves them starved while other tests run beside them)."""
    nodes = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": NODE_MEMORY,
            "include_dashboard": False,
            "_system_config": {"worker_niceness": WORKER_NICENESS},
        },
    )
    try:
        nodes.add_node(num_cpus=1, object_store_memory=NODE_MEMORY)
        nodes.wait_for_nodes()
        yield nodes
    finally:
        nodes.shutdown()


def campaign(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    """Run ``kvcheck campaign`` in-process; returns the exit code and the output."""
    code = main(["campaign", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def shards_by_kind(out: str) -> dict[str, int]:
    match = re.search(r"shards: \d+ \(swarm (\d+), machine (\d+), explore (\d+)\)", out)
    assert match, out
    return dict(zip(("swarm", "machine", "explore"), map(int, match.groups())))


def test_a_clean_campaign_on_two_nodes(cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Joined through --address, a short campaign on kvcore runs shards of every kind on both nodes,
    drives steps, and ends with every invariant held and exit code 0."""
    code, out = campaign(capsys, "--minutes", "0.25", "--address", cluster.address, "--repros", tmp_path / "repros")
    assert code == EXIT_OK, out
    assert "2 workers on 2 nodes" in out, out
    assert all(count >= 1 for count in shards_by_kind(out).values()), out
    steps = re.search(r"lockstep steps driven: ([\d,]+) in", out)
    assert steps and int(steps.group(1).replace(",", "")) > 0, out
    assert re.search(rf"coverage labels reached \(machine shards\): [1-9]\d*/{len(ALL_LABELS)}", out), out
    assert "verdict: every invariant held" in out, out
    assert not (tmp_path / "repros").exists()


def test_a_planted_fault_is_reported_once_with_a_repro_that_replays_failing(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With a seed bug planted, the first swarm and machine shards both find it, in several runs that
    shrink to a few distinct traces: the summary reports its invariant once, writes each distinct
    trace once, exits 1, and the shortest repro fails on replay with the fault and passes without."""
    repros = tmp_path / "repros"
    code, out = campaign(capsys, "--minutes", "0.1", "--address", cluster.address, "--fault", FAULT, "--repros", repros)
    assert code == EXIT_VIOLATION, out
    headers = [line for line in out.splitlines() if line.startswith(f"  {INVARIANT} violated:")]
    assert len(headers) == 1, out
    counts = re.search(r"(\d+) findings? by (\d+) shards?, (\d+) distinct shrunk traces?", headers[0])
    assert counts, headers[0]
    findings, shards, distinct = map(int, counts.groups())
    assert shards >= 2, out  # the first swarm shard and the first machine shard
    assert findings > distinct, out  # the first swarm shard alone finds it twice in one shrunk form

    written = sorted(repros.glob(f"campaign_{INVARIANT}_*.json"))
    assert len(written) == min(distinct, 20), out
    keys = {(load_trace(path).expect, load_trace(path).ops) for path in written}
    assert len(keys) == len(written), "a distinct failure was written twice"

    shortest = re.search(r"shortest repro \(\d+ steps\): (\S+\.json); test: (\S+\.py)", out[out.index(headers[0]) :])
    assert shortest, out
    trace = load_trace(shortest.group(1))
    outcome = replay(trace, resolve_target("kvcore", FAULT))
    assert outcome.violation is not None and outcome.violation.invariant == INVARIANT
    assert replay(trace, resolve_target("kvcore")).violation is None
    assert f"replay: kvcheck replay {shortest.group(1)} --fault {FAULT}" in out
    standalone = runpy.run_path(shortest.group(2))["test_trace_keeps_every_invariant"]
    with pytest.raises(AssertionError, match=INVARIANT):
        standalone()


def test_rediscoveries_count_as_findings_of_one_distinct_failure(tmp_path: Path) -> None:
    """The failure book keys a finding by its invariant and shrunk operations: the same trace found
    twice is one distinct failure of two findings; another trace of the same invariant is a second."""
    swarm_shard = next(shard_plan(0))
    result = run_shard(swarm_shard, ShardOptions("kvcore", FAULT, None, str(tmp_path / "db")))
    assert result.error is None and result.findings, result
    book = FailureBook()
    first = result.findings[0]
    assert book.add(first) is not None
    assert book.add(Finding(first.invariant, first.message, first.trace_text, "another shard", 99)) is None
    group = book.invariants[first.invariant]
    assert group.findings == first.times + 1 and group.shards == {swarm_shard.key, 99}
    assert len(group.distinct) == 1
    others = [f for f in result.findings[1:] if f.invariant == first.invariant]
    for other in others:
        assert book.add(other) is not None
    assert len(group.distinct) == 1 + len(others)


def test_a_swarm_shard_in_the_fast_mode_finds_what_checking_every_step_finds(tmp_path: Path) -> None:
    """``--full-check-every`` reaches the swarm shards, whose findings stay those of checking every step."""
    swarm_shard = next(shard_plan(0))
    every_step = run_shard(swarm_shard, ShardOptions("kvcore", FAULT, None, str(tmp_path / "db")))
    fast = run_shard(swarm_shard, ShardOptions("kvcore", FAULT, None, str(tmp_path / "db"), full_check_every=8))
    assert every_step.findings, every_step
    assert [(f.invariant, f.trace_text) for f in fast.findings] == [
        (f.invariant, f.trace_text) for f in every_step.findings
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--minutes", "0"], "--minutes: expected a number of minutes above 0"),
        (["--full-check-every", "0"], "--full-check-every: 0 is below the minimum of 1"),
        (["--minutes", "-1"], "--minutes: expected a number of minutes above 0"),
        (["--minutes", "nan"], "--minutes: expected a number of minutes above 0"),
        (["--workers", "0"], "--workers: 0 is below the minimum of 1"),
        (["--fault", "no-such-fault"], "unknown fault 'no-such-fault'"),
    ],
)
def test_bad_input_is_refused_before_ray_starts(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """A bad option exits 2 with a one-line message naming it."""
    code, out = campaign(capsys, *argv)
    assert code == EXIT_BAD_INPUT, out
    assert message in out, out


def test_without_ray_the_campaign_says_how_to_install_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Ray not importable, kvcheck campaign exits 2 and names the extra to install."""
    monkeypatch.setitem(sys.modules, "ray", None)
    code, out = campaign(capsys, "--minutes", "1")
    assert code == EXIT_BAD_INPUT, out
    assert "pip install 'kvcheck[campaign]'" in out, out
