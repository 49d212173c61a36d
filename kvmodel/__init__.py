"""The abstract reference model of a paged KV-cache allocator, and its whole vocabulary.

Operations (:mod:`kvmodel.ops`) and the step each asks for (:mod:`kvmodel.step_plans`), the
configuration (:mod:`kvmodel.config`, its limits in :mod:`kvmodel.limits`), observations
(:mod:`kvmodel.observation`), the release semantics (:mod:`kvmodel.semantics`), the group kinds
(:mod:`kvmodel.kinds`), the model (:mod:`kvmodel.manager_model` composed from :mod:`kvmodel.manager`,
:mod:`kvmodel.pool_model`) and the named invariants (:mod:`kvmodel.invariants`). Plain lists, dicts and
sets that state what the allocator must do. Nothing here imports ``kvcore`` or ``kvcheck``: the model is
an independent statement of the semantics, not a second copy of the code under test, and not built on
what drives it.
"""
