"""The exhaustive explorer: a small scope is exhausted clean, and a fault's counterexample is a shortest one."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from kvcheck import cli
from kvcheck.explore import canonical_state, explore
from kvcheck.replay import replay, resolve_target
from kvcheck.scopes import SCOPES
from kvcheck.targets import load_target
from kvcheck.trace import load_trace
from kvmodel.manager_model import ManagerModel
from kvmodel.ops import AddRequest, Schedule

CI_SCOPE = SCOPES["ci"]


def test_the_ci_scope_is_exhausted_on_kvcore_without_a_violation() -> None:
    """Every sequence of up to 4 operations over the ci scope keeps every invariant on kvcore."""
    report = explore(load_target("kvcore"), CI_SCOPE)
    assert report.failure is None, str(report.failure and report.failure.violation)
    assert report.exhausted
    assert [stats.depth for stats in report.depths] == [1, 2, 3, 4]
    assert report.distinct > 1000 and report.explored > report.distinct


def test_a_fault_is_found_with_a_shortest_counterexample() -> None:
    """The FIFO flip shows after 3 operations; no sequence of 2 shows it, so 3 is the shortest."""
    faulty = resolve_target("kvcore", "fifo-reuse-when-caching-off")
    report = explore(faulty, CI_SCOPE)
    assert report.failure is not None
    assert report.failure.violation.invariant == "lifo_head_reuse_when_caching_off"
    assert len(report.failure.ops) == 3
    shallower = explore(faulty, attrs.evolve(CI_SCOPE, depth=2))
    assert shallower.exhausted and shallower.failure is None


def test_states_that_differ_only_in_request_names_are_one_state() -> None:
    config, _ = CI_SCOPE.configs()[0]
    first, second = ManagerModel(config), ManagerModel(config)
    for op in (AddRequest("r0", (0,)), AddRequest("r1", (1,)), Schedule("r1", 1)):
        first.apply(op)
    for op in (AddRequest("r0", (1,)), AddRequest("r1", (0,)), Schedule("r0", 1)):
        second.apply(op)
    assert canonical_state(first) == canonical_state(second)
    second.apply(Schedule("r1", 1))
    assert canonical_state(first) != canonical_state(second)


def test_the_command_writes_a_counterexample_that_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["explore", "--fault", "free-table-head-first", "--repros", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == cli.EXIT_VIOLATION
    assert "shortest counterexample (3 steps)" in out
    (trace_path,) = tmp_path.glob("*.json")
    trace = load_trace(trace_path)
    assert replay(trace, resolve_target("kvcore", "free-table-head-first")).violation is not None
    assert replay(trace, load_target("kvcore")).violation is None


def test_the_command_reports_an_exhausted_scope(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explore", "--depth", "2"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "scope exhausted at depth 2: no violation" in out
    assert "states/s" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--depth", "13"], "--depth: 13 is above the limit of 12"),
        (["--layouts", "full,ring"], "--layouts: unknown 'ring'"),
        (["--features", "mamba"], "--features: unknown 'mamba'"),
        (["--block-sizes", "1,x"], "--block-sizes: expected comma-separated integers"),
        (["--scope", "huge"], "--scope: unknown scope 'huge'"),
        (["--caching", "maybe"], "--caching: expected on, off or both"),
        (["--reach", "0"], "--reach: 0 is below the minimum of 1"),
    ],
)
def test_bad_scope_options_are_refused_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["explore", *argv]) == cli.EXIT_BAD_INPUT
    assert message in capsys.readouterr().err
