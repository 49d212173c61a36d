"""The manager machine against the chosen target (kvcore unless --target says otherwise)."""

from __future__ import annotations

import warnings
from collections import Counter

from hypothesis import settings

from kvcheck.coverage.labels import EXAMPLES_FACTOR, reachable_labels
from kvcheck.coverage.tally import LABELS_SEEN
from kvcheck.profiles import labels_must_be_reached, loaded_profile
from kvcheck.targets import TargetFactory

from .run import run_manager_machine


def test_manager_machine_keeps_every_invariant(make_target: TargetFactory, num_groups: int | str | None) -> None:
    """Interleaved schedule / decode / preempt / failed-load / evict / reset / finish sequences
    across 1 to 4 hybrid groups (or the Mamba layouts) keep every named invariant after every step,
    and, under a derandomized profile with the ci budget, reach every coverage label the run must reach."""
    before = Counter(LABELS_SEEN)
    base = loaded_profile()
    if num_groups in EXAMPLES_FACTOR and labels_must_be_reached(base):
        base = settings(base, max_examples=EXAMPLES_FACTOR[num_groups] * base.max_examples)
    run_manager_machine(make_target, num_groups, base)
    seen = LABELS_SEEN - before
    missing = [label for label in reachable_labels(num_groups) if not seen[label]]
    if not missing:
        return
    message = f"coverage labels never reached: {missing}; seen: {dict(seen)}"
    assert not labels_must_be_reached(loaded_profile()), message
    warnings.warn(message, stacklevel=1)
