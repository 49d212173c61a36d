"""The vLLM releases whose semantics the model states, and the behaviours in which they differ.

A *behaviour* is something vLLM's scheduler or allocator does in some
releases and not in others that changes the allocator calls a scheduler
makes or the outcome the model predicts.  Each row names the release it
arrived in and, for every known release, the vLLM file and line where that
release decides it.  A :class:`Semantics` names the release a run follows;
which release that is (the installed vLLM's, read from its files) is decided
above the model, by ``kvcheck.vllm_releases``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

KNOWN_VERSIONS = ("0.33.0", "0.34.0")
"""The vLLM releases whose semantics are stated here, oldest first; the last is the newest, which
kvcore follows."""

NEWEST = KNOWN_VERSIONS[-1]


@attrs.frozen
class Behaviour:
    """One way vLLM releases differ: ``name`` (what the model and the harness test), ``statement``
    (what a release that has it does), ``since`` (the first known release that has it) and
    ``sources`` (per known release, the vLLM file and line that decides it there)."""

    name: str
    statement: str
    since: str
    sources: Mapping[str, str]


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


def release_key(version: str) -> tuple[int, int, int]:
    """The leading ``major.minor.patch`` of a version (``0.35.0.dev12+g1a2b`` gives ``(0, 35, 0)``)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise ValueError(f"vLLM version {version!r} does not start with major.minor")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)
