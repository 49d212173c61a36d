"""kvcheck: property-based model checking for paged KV-cache block allocators.

Target adapters, the drivers (lockstep, swarm, explorer, campaign), traces,
faults, export and the command line live here, on top of :mod:`kvcore` (the
allocator) and :mod:`kvmodel` (the reference model, its operations,
configuration, observations and invariants).  The state machines are
:mod:`kvcheck.stateful_tests` and the corpus :mod:`kvcheck.regressions` (the
repository's top-level ``stateful_tests/`` and ``regressions/`` folders,
installed inside kvcheck).
"""
