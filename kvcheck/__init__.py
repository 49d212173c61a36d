"""kvcheck: the harness that drives KV-cache allocators and a reference model in lockstep.

Operations, the target configuration, target adapters, invariant reports and
traces live here.  The reference model and the named invariants are
:mod:`kvcheck.models`, the state machines :mod:`kvcheck.stateful_tests`, the
corpus :mod:`kvcheck.regressions` (the repository's top-level ``models/``,
``stateful_tests/`` and ``regressions/`` folders, installed inside kvcheck).
"""
