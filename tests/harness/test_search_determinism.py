"""A derandomized manager-machine search is the same in every process.

The seed-bug tests rely on it: a search that drove other operations after
other tests had run, or under another string-hash seed, could catch a bug
alone and miss it in the gate.  Hypothesis may draw values from the
constants of every local module in ``sys.modules``
(:func:`kvcheck.profiles.pin_generation_constants` pins that pool),
and Python's string hashing changes set order from one process to the next.
Each search here runs in a fresh interpreter: one plain, one that first
imports a local module full of integer constants and hashes strings with
another seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine

from kvcheck.profiles import PROFILES
from kvcheck.stateful_tests.manager_machine import manager_machine
from kvcheck.stateful_tests.run import run_machine
from kvcheck.targets import TargetFactory
from kvcheck.targets.kvcore_target import KvcoreTarget
from kvmodel.ops import Operation, StepResult

ROOT = Path(__file__).resolve().parents[2]

SEARCH = """
import hashlib, sys
sys.path[:0] = [{root!r}, {extra!r}]
if {import_constants!r}:
    import kvcheck_constants_module  # noqa: F401
from hypothesis import settings
from kvcheck.targets.kvcore_target import KvcoreTarget
from kvcheck.profiles import PROFILES, pin_generation_constants
from kvcheck.stateful_tests.run import run_manager_machine

pin_generation_constants()
digest = hashlib.sha256()

class Recording(KvcoreTarget):
    def apply(self, op):
        digest.update(repr(op).encode())
        return super().apply(op)

run_manager_machine(Recording, num_groups=2, base=settings(PROFILES["ci"], max_examples=60))
print(digest.hexdigest())
"""


def _search_digest(tmp_path: Path, import_constants: bool, hash_seed: int) -> str:
    script = SEARCH.format(root=str(ROOT), extra=str(tmp_path), import_constants=import_constants)
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_derandomized_search_drives_the_same_operations_in_every_process(tmp_path: Path) -> None:
    """The operations a derandomized run drives are identical with and without an extra local
    module imported first, and under two string-hash seeds."""
    lines = [f"VALUE_{n} = {n * 7919 % 1000 + 2}" for n in range(200)]
    (tmp_path / "kvcheck_constants_module.py").write_text("\n".join(lines) + "\n")
    alone = _search_digest(tmp_path, import_constants=False, hash_seed=1)
    after_imports = _search_digest(tmp_path, import_constants=True, hash_seed=2)
    assert alone == after_imports


def _ops_driven(machine_of: Callable[[TargetFactory], type[RuleBasedStateMachine]]) -> list[str]:
    driven: list[str] = []

    class Recording(KvcoreTarget):
        def apply(self, op: Operation) -> StepResult:
            driven.append(repr(op))
            return super().apply(op)

    run_machine(machine_of(Recording), settings(PROFILES["ci"], max_examples=30))
    return driven


def test_derandomized_search_does_not_depend_on_the_machine_source_text() -> None:
    """The ci profile's search starts from a fixed seed: a machine whose source text differs (here a
    subclass with a docstring of its own) drives exactly the same operations, where Hypothesis's own
    derandomization, seeded from a digest of the source, would search other examples."""

    def edited(make_target: TargetFactory) -> type[RuleBasedStateMachine]:
        class EditedManagerMachine(manager_machine(make_target, 2)):  # type: ignore[misc]
            """The manager machine after an edit that changes nothing it does."""

        return EditedManagerMachine

    as_is = _ops_driven(lambda make_target: manager_machine(make_target, 2))
    assert len(as_is) > 100
    assert _ops_driven(edited) == as_is
