"""Whether kvcore and vLLM 0.33.0 build a manager for a configuration and look a request up in it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kvcore
from kvcheck.targets.kvcore_target import kvcore_spec
from kvcheck.targets.vllm_target import make_manager, make_request
from kvmodel.group_spec import GroupSpec

NUM_BLOCKS = 16


def _request_tokens(keywords: dict[str, Any]) -> list[int]:
    """A prompt three scheduler blocks and a token long: every group has blocks to look up."""
    return list(range(3 * int(keywords["scheduler_block_size"]) + 1))


def kvcore_config(groups: Sequence[GroupSpec], **keywords: Any) -> kvcore.KVCacheConfig:
    """kvcore's configuration of the groups (each with its own ``block_size``) under ``keywords``."""
    specs = [kvcore_spec(group, group.block_size) for group in groups]  # type: ignore[arg-type]
    return kvcore.KVCacheConfig(NUM_BLOCKS, specs, **keywords)


def kvcore_refusal(groups: Sequence[GroupSpec], **keywords: Any) -> kvcore.InvalidConfig | None:
    """kvcore's refusal of the groups (each with its own ``block_size``) under ``keywords`` (those of
    ``kvcore.KVCacheConfig``, ``scheduler_block_size`` and ``hash_block_size`` among them), at
    construction or at the first lookup; ``None`` when it builds the manager and looks a request up."""
    try:
        manager = kvcore.KVCacheManager(kvcore_config(groups, **keywords))
        manager.get_computed_blocks(kvcore.Request("r0", _request_tokens(keywords), keywords["hash_block_size"]))
    except kvcore.InvalidConfig as refused:
        return refused
    return None


def vllm_refusal(groups: Sequence[GroupSpec], **keywords: Any) -> tuple[str | None, Any]:
    """How vLLM refused the same (its assertion or error, shortened), or ``None`` and the manager it
    built and looked a request up in; ``keywords`` are those of ``make_manager``."""
    try:
        manager = make_manager(groups, NUM_BLOCKS, [group.block_size for group in groups], **keywords)  # type: ignore[misc]
        manager.get_computed_blocks(make_request("r0", _request_tokens(keywords), keywords["hash_block_size"]))
    except (AssertionError, ValueError, NotImplementedError) as refused:
        return f"{type(refused).__name__}: {str(refused)[:120]}", None
    return None, manager
