"""``kvcheck campaign``: a long search split into shards run as Ray tasks, on one machine or a cluster.

A *shard* is a few seconds of one of the three searches, run by one Ray
task on one CPU:

- ``swarm``: the swarm driver (:mod:`kvcheck.swarm`) over a range of
  consecutive seeds, :data:`SWARM_RUNS_PER_SEED` runs each;
- ``machine``: the Hypothesis manager machine with a seed of its own
  (:data:`MACHINE_EXAMPLES_PER_SHARD` examples), every machine shard sharing
  one Hypothesis example database folder, so that a failing example one shard
  saved is replayed first by the shards after it;
- ``explore``: the exhaustive explorer (:mod:`kvcheck.explore`) on one
  configuration of the ``standard`` scope, at depth 4 for every
  configuration, then at depth 5.

The driver keeps every worker busy (one shard queued besides) until the time
budget is spent; a shard stops at the budget's end too (a machine shard
finishes its examples first), except the first shard of each kind, which runs
whole however short the budget, so that every campaign searches with each.
Each shard shrinks its own failures with :func:`kvcheck.shrink.shrink`; the
driver deduplicates them by invariant and shrunk operations, writes each
distinct one out with :func:`kvcheck.repro.write_repro` (at most
:data:`MAX_REPROS_PER_INVARIANT` per invariant), and reports each violated
invariant once, with its shortest repro.  Shards report their steps and
coverage labels once a second to a small Ray actor, which the driver reads for
its status line.

Ray is imported only by :func:`run_campaign`'s caller (``kvcheck campaign``),
so the rest of kvcheck works without it.
"""

from __future__ import annotations

from kvcheck.campaign.driver import Campaign, CampaignReport, KindTotals, summary_lines
from kvcheck.campaign.findings import MAX_REPROS_PER_INVARIANT, DistinctFailure, FailureBook, InvariantFailures
from kvcheck.campaign.ray_session import (
    OBJECT_STORE_BYTES,
    RAY_MISSING,
    WORKER_NICENESS,
    default_workers,
    import_ray,
    ray_session,
    run_campaign,
)
from kvcheck.campaign.shards import (
    EXPLORE_DEPTHS,
    EXPLORE_SCOPE,
    MACHINE_EXAMPLES_PER_SHARD,
    MACHINE_LAYOUTS,
    SHARD_KINDS,
    SWARM_RUNS_PER_SEED,
    SWARM_SEEDS_PER_SHARD,
    Finding,
    ProgressBoard,
    ShardOptions,
    ShardResult,
    ShardSpec,
    explore_cells,
    ray_shard,
    run_shard,
    shard_plan,
)

__all__ = [
    "EXPLORE_DEPTHS",
    "EXPLORE_SCOPE",
    "MACHINE_EXAMPLES_PER_SHARD",
    "MACHINE_LAYOUTS",
    "MAX_REPROS_PER_INVARIANT",
    "OBJECT_STORE_BYTES",
    "RAY_MISSING",
    "SHARD_KINDS",
    "SWARM_RUNS_PER_SEED",
    "SWARM_SEEDS_PER_SHARD",
    "WORKER_NICENESS",
    "Campaign",
    "CampaignReport",
    "DistinctFailure",
    "FailureBook",
    "Finding",
    "InvariantFailures",
    "KindTotals",
    "ProgressBoard",
    "ShardOptions",
    "ShardResult",
    "ShardSpec",
    "default_workers",
    "explore_cells",
    "import_ray",
    "ray_session",
    "ray_shard",
    "run_campaign",
    "run_shard",
    "shard_plan",
    "summary_lines",
]
