"""The suite bites: every catalogued fault is killed, and the seed bugs shrink to short repros.

One test per fault, each hunting only its own fault, so xdist spreads the hunts over its
workers and none is done twice.  The test stops at the first kill (``failures_wanted=1``);
``kvcheck kill-matrix`` keeps the shortest of three.
"""

from __future__ import annotations

import pytest

from kvcheck.faults import FAULTS
from kvcheck.kill_matrix import KillBudget, kill, shrunk_trace
from kvcheck.replay import replay, resolve_target

BUDGET = KillBudget(failures_wanted=1)
MAX_SHRUNK_STEPS = 8
"""Every fault's swarm repro, once shrunk, is at most this long."""
SEED_FAULT_MAX_STEPS = {"fifo-reuse-when-caching-off": 4, "interleaved-external-alloc": 8}
"""The swarm driver has no warm start: its seed-003 repro builds the warm pool from two requests
(7 steps from the fixed seeds); the manager machine's, from a warm start, is 4 steps."""
EVENT_FAULTS = ("evicted-block-removal-unreported", "stored-event-repeats-cached-blocks", "reset-unreported")
"""The KV cache event faults leave the cache itself right: only the event stream's invariants see them."""
KILLED_BY = {
    # The seed-003 cross-group double allocation shows in the blocks themselves.
    "interleaved-external-alloc": ("no_duplicate_block_ids", "ref_cnt_matches_holders"),
    **dict.fromkeys(EVENT_FAULTS, ("events_match_cache", "events_match_model")),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_every_catalogued_fault_is_killed_and_shrinks_to_a_short_repro(name: str) -> None:
    """Within the fixed budget the driver breaks an invariant with the fault planted, and the failure
    shrinks to at most 8 steps (the seed bugs to at most 4 and 8), which fail on replay under the
    fault with the invariant reported and pass on kvcore as it is."""
    result = kill(FAULTS[name], BUDGET)
    assert result.killed, f"{name} survived {len(BUDGET.seeds)} seeds x {BUDGET.runs_per_seed} runs"
    limit = SEED_FAULT_MAX_STEPS.get(name, MAX_SHRUNK_STEPS)
    assert result.shrunk_steps is not None and result.shrunk_steps <= limit, result
    if name in KILLED_BY:
        assert result.invariant in KILLED_BY[name], result
    trace = shrunk_trace(result)
    assert replay(trace, resolve_target("kvcore")).violation is None
    planted = replay(trace, resolve_target("kvcore", name)).violation
    assert planted is not None and planted.invariant == result.invariant


def test_the_named_faults_are_catalogued() -> None:
    """The faults this file holds to a tighter limit or a named invariant are in the catalogue."""
    assert set(SEED_FAULT_MAX_STEPS) | set(KILLED_BY) <= set(FAULTS)
