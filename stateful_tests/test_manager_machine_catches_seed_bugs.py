"""The Hypothesis manager machine itself reaches the two seed bugs and shrinks them to short repros.

Each seed fault is planted into each built-in allocator that ``--target``
names, one at a time (kvcore, vLLM, or both for ``kvcore+vllm``: a bug planted
into one side of a differential target would fail ``targets_agree`` rather
than the seed's invariant).  A ``package.module:factory`` allocator cannot
carry kvcheck's plants, so for it the machine's reach is checked on kvcore.  The machine runs with fixed settings,
whatever profile is loaded: seeded from several fixed seeds, four times the
``dev`` budget each (4,000 examples; a planted seed bug is usually found in
seconds, so the budget only bounds an unlucky search), no example database.  Generation does not depend on what ran
before in the process (:func:`kvcheck.profiles.pin_generation_constants`),
and shrinking is kvcheck's own, which is deterministic and not bounded by
time, so the outcome is the same under any ``-n``, test order or load.
Catching the bug from every seed, not one lucky one, is the point:
``benchmarks/bench_detection.py`` measures the catch rate over random seeds.
Under a profile smaller than ``ci`` (``smoke``, which only shows that an
installation runs the suite) the first seed alone is searched.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvcheck.lockstep import Lockstep
from kvcheck.profiles import PROFILES, has_ci_budget, loaded_profile
from kvcheck.replay import resolve_target
from kvcheck.targets import component_allocators

from .run import ShrunkViolation, run_manager_machine

SEEDS = (0, 1, 2)
"""The seeds searched under a profile with at least the ``ci`` budget (the first alone under a smaller one)."""

SEARCH = settings(PROFILES["ci"], max_examples=4 * PROFILES["dev"].max_examples)
"""Four times the dev budget.  Within the dev budget the cross-group double allocation is caught from
most seeds, not all (seeds 3 to 8: five of six, the same before and after the drivers began loading
external tokens beside align-mode Mamba groups; seed 2 now needs some 3,000 examples): an unlucky
search takes longer, and the budget only bounds it."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "planted_into" in metafunc.fixturenames:
        allocators = component_allocators(metafunc.config.getoption("kvcheck_target")) or ["kvcore"]
        metafunc.parametrize("planted_into", allocators)
    if "seed" in metafunc.fixturenames:
        seeds = SEEDS if has_ci_budget(loaded_profile()) else SEEDS[:1]
        metafunc.parametrize("seed", seeds, ids=[f"seed-{seed}" for seed in seeds])


@pytest.mark.parametrize(
    ("fault", "invariants", "max_steps"),
    [
        ("fifo-reuse-when-caching-off", ("lifo_head_reuse_when_caching_off",), 4),
        # From seed 1 the search meets this bug first in a ring + chunked-local(6) layout, where it
        # shows only once a request's first chunk has left its window: 11 steps (4 from seeds 0 and 2).
        ("interleaved-external-alloc", ("no_duplicate_block_ids", "ref_cnt_matches_holders"), 11),
    ],
)
def test_manager_machine_catches_seed_bug(
    planted_into: str, fault: str, invariants: tuple[str, ...], max_steps: int, seed: int
) -> None:
    """With the seed bug planted, the two-group manager machine fails by the named invariant,
    and the shrunk failing run is at most ``max_steps`` operations long."""
    make_target = resolve_target(planted_into, fault)
    with pytest.raises(ShrunkViolation) as caught:
        run_manager_machine(make_target, num_groups=2, base=SEARCH, seed=seed)
    violation = caught.value
    assert violation.invariant in invariants, violation
    shrunk = Lockstep.latest
    assert shrunk is not None and len(shrunk.trace) == violation.step
    assert violation.step <= max_steps, str(violation)
