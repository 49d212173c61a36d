"""Hypothesis profiles, and what makes a derandomized search the same in every process.

Profiles: ``dev`` (default on a workstation), ``ci`` (default when the CI
environment variable is set: derandomized and bounded), ``thorough`` (an
order of magnitude more examples and longer runs) and ``smoke`` (a
derandomized handful, to check that an installation runs the suite).  Choose one with
``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME``.

The manager machine searches with Hypothesis and shrinks with kvcheck's own
trace shrinker (:mod:`kvcheck.stateful_tests.run`), so the profiles leave out
Hypothesis's explain phase, and the manager machine also its shrink phase.

A derandomized profile (``ci``, ``smoke``) searches from :data:`SEARCH_SEED`
(see :func:`search_seed`), not from Hypothesis's own derandomization, which
seeds from a digest of the machine's source text: with it, any edit to a
machine reshuffled the ci search and could leave a rare coverage label
unreached.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

SEARCH_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
"""The phases that look for a failure.  Shrinking is kvcheck's (deterministic, not bounded by time);
the target phase is left out because hill-climbing on one score spent half of a run's examples on
one configuration, where fresh examples visit many (measured by benchmarks/bench_detection.py)."""

SEARCH_SEED = 20261205
"""The seed of every derandomized run of kvcheck's machines.  Chosen once, when the ci search stopped
depending on the machines' source text: under it every coverage label is reached at least 3 times in the
ci run of each layout (``benchmarks/bench_labels.py``, which also shows that each label is reached from
random seeds, not from this one alone: ``docs/measurements/labels.md``)."""

_COMMON = settings(
    deadline=None,
    suppress_health_check=SLOW_OK,
    # The free-queue and block-pool machines shrink with Hypothesis; the manager
    # machine's runner drops the shrink phase (stateful_tests/run.py).
    phases=(*SEARCH_PHASES, Phase.shrink),
)

PROFILES = {
    # 1,000 examples: every catalogued fault is caught from at least 19 seeds in 20
    # (benchmarks/bench_detection.py); a clean run takes some 15 s per layout.
    # Randomized even where the CI variable makes Hypothesis load its own derandomized ``ci`` profile.
    "dev": settings(_COMMON, derandomize=False, max_examples=1000, stateful_step_count=40),
    # The dev budget, derandomized: fewer examples left the rarer coverage labels (R-SWA's gap, a
    # Mamba state freed) unreached under some seeds.
    "ci": settings(
        _COMMON, derandomize=True, database=None, max_examples=1000, stateful_step_count=40, print_blob=True
    ),
    "thorough": settings(_COMMON, derandomize=False, max_examples=20_000, stateful_step_count=80, print_blob=True),
    # A derandomized handful: shows that an installation runs the suite, not that the allocator is
    # right.  Too few examples to reach the coverage labels, which only the ci budget must reach.
    "smoke": settings(
        _COMMON, derandomize=True, database=None, max_examples=50, stateful_step_count=20, print_blob=True
    ),
}


def has_ci_budget(current: settings) -> bool:
    """Whether ``current`` searches with at least the ``ci`` budget (``smoke`` does not: it only shows
    that an installation runs the suite)."""
    return current.max_examples >= PROFILES["ci"].max_examples


def labels_must_be_reached(current: settings) -> bool:
    """A derandomized run with at least the ``ci`` budget is the same every time, so a coverage label
    it misses is a generator regression; a randomized or smaller run may just not have got there."""
    return current.derandomize and has_ci_budget(current)


def loaded_profile() -> settings:
    """The settings of the profile loaded (Hypothesis always has one)."""
    current = settings.default
    if current is None:
        raise RuntimeError("no Hypothesis profile is loaded")
    return current


def search_seed(current: settings) -> int | None:
    """The seed a machine run under ``current`` searches from: :data:`SEARCH_SEED` when the profile is
    derandomized (the same search in every process and after any edit to the machines), none when it
    is randomized (Hypothesis draws one per run)."""
    return SEARCH_SEED if current.derandomize else None


def pin_generation_constants() -> None:
    """Make Hypothesis's draws independent of which modules this process has imported.

    Hypothesis mixes into its draws the literal constants of every *local*
    module in ``sys.modules``.  Which of those are imported depends on what
    ran before in the process (another test file, ``--target vllm``
    importing the vLLM adapter, the ``kvcheck run`` summary), so without
    this a derandomized run searches a different sequence of examples from
    one process to the next: a seed-bug test caught its bug alone and missed
    it after other tests.  The pool of local constants is pinned empty;
    Hypothesis's own built-in constants still apply.
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # a Hypothesis without local constants has nothing to pin
        return
    if not hasattr(providers, "_get_local_constants"):
        return
    empty = providers.Constants()  # type: ignore[attr-defined]  # not exported, as the pool it replaces
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()


def register_profiles(chosen: str | None = None) -> None:
    """Register the profiles and load ``chosen`` (``--hypothesis-profile``), or else the one the
    environment asks for."""
    for name, profile in PROFILES.items():
        settings.register_profile(name, profile)
    default = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
    settings.load_profile(chosen or default)
    pin_generation_constants()
