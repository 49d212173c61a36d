"""Coverage labels: the states where allocator bugs live, reported with ``event()``.

Labels are computed from the model around one step, so they name what the step did, not how the target
did it: the catalogue and the layouts that must reach each label (:mod:`~kvcheck.coverage.labels`), what
the model holds before a step (:mod:`~kvcheck.coverage.before`) and what its caching of Mamba states did
(:mod:`~kvcheck.coverage.states`), the labels one step earned (:mod:`~kvcheck.coverage.step`), and the
tally of those reached (:mod:`~kvcheck.coverage.tally`).
"""
