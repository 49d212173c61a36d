"""kvcheck: the harness that drives KV-cache allocators and a reference model in lockstep.

Operations, the target configuration, target adapters, invariant reports and
traces live here.  The reference model and the named invariants live in the
repository's ``models/`` package, the state machines in ``stateful_tests/``.
"""
