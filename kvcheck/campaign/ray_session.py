"""Ray for a campaign: imported only when a campaign runs, started on this machine or joined at an
address, and the campaign run inside it."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from kvcheck.campaign.driver import Campaign, CampaignReport, plural_s
from kvcheck.campaign.shards import ShardOptions

OBJECT_STORE_BYTES = 128 * 1024 * 1024
"""The object store of an embedded Ray (shards pass a few kilobytes each)."""
WORKER_NICENESS = 0
"""The niceness of an embedded Ray's workers.  Ray's default, 15, lets any other busy process on the
machine take the workers' cores: with two busy processes on two cores, a 15 s campaign took three
minutes.  A campaign runs at the priority ``kvcheck run`` does; ``--workers`` bounds its cores."""
RAY_MISSING = "kvcheck campaign runs on Ray, which is not installed: pip install 'kvcheck[campaign]'"


def import_ray() -> Any:
    """Ray, or ``None`` when it is not installed."""
    try:
        import ray
    except ImportError:
        return None
    return ray


def default_workers() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def ray_session(ray: Any, address: str | None, workers: int | None) -> Iterator[int]:
    """Ray started on this machine (``num_cpus`` the workers), or joined at ``address``; yields the
    number of workers (by default the CPUs available: this machine's, or the cluster's)."""
    if ray.is_initialized():
        yield workers or int(ray.cluster_resources().get("CPU", 1))
        return
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address:
        ray.init(address=address, **quiet)
    else:
        workers = workers or default_workers()
        ray.init(
            num_cpus=workers,
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            _system_config={"worker_niceness": WORKER_NICENESS},
            **quiet,
        )
    try:
        yield workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    finally:
        ray.shutdown()


def run_campaign(
    ray: Any,
    *,
    minutes: float,
    address: str | None = None,
    workers: int | None = None,
    target: str = "kvcore",
    fault: str | None = None,
    num_groups: int | None = None,
    seed: int = 0,
    repros: Path = Path("repros"),
    database: Path | None = None,
    full_check_every: int = 1,
    out: TextIO = sys.stdout,
) -> CampaignReport:
    """Run a campaign of ``minutes`` on Ray (the module, imported by the caller) and print its
    status line; the summary is :func:`summary_lines`.  ``database`` keeps the machine shards'
    Hypothesis example database (by default a temporary folder, removed afterwards)."""
    from kvcheck.replay import resolve_target

    resolve_target(target, fault)  # an unknown target or fault raises ValueError before Ray starts
    folder = str(database.resolve()) if database else tempfile.mkdtemp(prefix="kvcheck-campaign-db-")
    try:
        with ray_session(ray, address, workers) as count:
            nodes = [node for node in ray.nodes() if node.get("Alive")]
            under = f", fault {fault}" if fault else ""
            out.write(
                f"kvcheck campaign: target {target}{under}, {minutes:g} min on {count} workers "
                f"({len(nodes)} node{plural_s(len(nodes))}), repros to {repros}\n"
            )
            out.flush()
            options = ShardOptions(target, fault, num_groups, folder, full_check_every=full_check_every)
            campaign = Campaign(
                ray,
                options,
                workers=count,
                budget_seconds=minutes * 60,
                seed=seed,
                repros=repros,
                out=out,
            )
            report = campaign.run()
    finally:
        if database is None:
            shutil.rmtree(folder, ignore_errors=True)
    report.database = str(database) if database else None
    return report
