"""Running the manager machine: Hypothesis searches, kvcheck's trace shrinker shrinks.

Hypothesis's own shrinker works on its choice sequence and may take minutes
on a long stateful run, cut short by a wall-clock limit that makes the
result depend on the machine's load.  kvcheck's shrinker works on the
operations themselves, takes seconds, and gives the same repro for the same
failing run whatever the load, so the manager machine stops at the first
failing example (no shrink or explain phase, one bug reported) and hands
that run to :func:`kvcheck.shrink.shrink`.
"""

from __future__ import annotations

import attrs
from hypothesis import seed as fixed_seed
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from kvcheck.lockstep import Lockstep
from kvcheck.profiles import SEARCH_PHASES, loaded_profile, search_seed
from kvcheck.shrink import replay_violation, shrink
from kvcheck.swarm import Failure
from kvcheck.targets import TargetFactory
from kvmodel.invariants import InvariantViolation

from .manager_machine import manager_machine


@attrs.define(auto_exc=True, str=False)
class ShrunkViolation(InvariantViolation):
    """An invariant violation found by the manager machine, shrunk to a minimal run.

    ``found_at_step`` is the failing step of the run Hypothesis found;
    ``shrunk`` is the minimal failure (its configuration and operations).
    """

    found_at_step: int = 0
    shrunk: Failure | None = None

    def __str__(self) -> str:
        text = super().__str__()
        if self.shrunk is None:
            return text
        from kvmodel.ops import describe_op

        lines = [text, f"shrunk from {self.found_at_step} to {len(self.shrunk.ops)} steps by kvcheck's shrinker:"]
        lines.append(f"  config: {self.shrunk.config.describe()}")
        lines.extend(f"  {number} {describe_op(op)}" for number, op in enumerate(self.shrunk.ops, start=1))
        return "\n".join(lines)


def search_settings(base: settings | None = None, seed: int | None = None) -> settings:
    """``base`` (the loaded profile by default) searching only: the first failing example is reported
    as is.  With ``seed``, the search is seeded instead of derandomized, and uses no database."""
    base = base or loaded_profile()
    phases = [phase for phase in base.phases if phase in SEARCH_PHASES]
    return seeded_settings(settings(base, phases=phases, report_multiple_bugs=False), seed)


def seeded_settings(base: settings, seed: int | None) -> settings:
    """``base`` searching from ``seed`` (no derandomization, no database), or ``base`` itself without one."""
    if seed is None:
        return base
    return settings(base, derandomize=False, database=None)


def run_machine(machine: type[RuleBasedStateMachine], base: settings | None = None, seed: int | None = None) -> None:
    """Run a state machine under ``base`` (the loaded profile by default) from ``seed``; without one, a
    derandomized profile searches from its fixed seed (:func:`kvcheck.profiles.search_seed`)."""
    __tracebackhide__ = True
    base = base or loaded_profile()
    seed = search_seed(base) if seed is None else seed
    if seed is not None:
        machine = fixed_seed(seed)(machine)
    run_state_machine_as_test(machine, settings=seeded_settings(base, seed))


def run_manager_machine(
    make_target: TargetFactory,
    num_groups: int | str | None = None,
    base: settings | None = None,
    seed: int | None = None,
) -> None:
    """Run the manager machine; a failure is raised as a :class:`ShrunkViolation` of the minimal run.

    ``base`` is the settings to search with (the loaded profile by default);
    ``seed`` fixes the search's random seed (a derandomized ``base`` has one already:
    :func:`kvcheck.profiles.search_seed`).  Afterwards ``Lockstep.latest``
    is the minimal run, so the repro hook writes the shrunk trace.
    """
    __tracebackhide__ = True  # pytest shows the shrunk failure, not this function's source
    base = base or loaded_profile()
    seed = search_seed(base) if seed is None else seed
    try:
        run_machine(manager_machine(make_target, num_groups), search_settings(base, seed), seed)
    except InvariantViolation as violation:
        failing = Lockstep.latest
        if failing is None or len(failing.trace) < violation.step:
            raise
        found = Failure(failing.config, tuple(failing.trace[: violation.step]), violation)
        small = shrink(make_target, found)
        # Replay the minimal run last, so that it is the Lockstep the repro hook reads.
        final = replay_violation(make_target, small.config, small.ops) or small.violation
        raise ShrunkViolation(
            final.invariant,
            final.step,
            final.op,
            final.detail,
            final.expected,
            final.actual,
            found_at_step=violation.step,
            shrunk=small,
        ) from None
