"""The vLLM target: vLLM's own KVCacheManager, driven the way its scheduler drives it.

vLLM is optional.  Nothing here imports it until a target (or a benchmark
backend) is built; then :func:`require_vllm` imports the allocator modules
once and reads the installed release as the nearest known one
(:mod:`kvcheck.vllm_releases`), warning when it is not a release kvcheck
knows or its watched files differ from that release's.  ``scripts/install-vllm-cpu.sh VENV_DIR`` sets up a CPU-only
venv that can import it.

The construction helpers (:func:`make_manager`, :func:`make_block_pool`,
:func:`make_request`) build what vLLM's engine builds for one model: one
``KVCacheGroupSpec`` per group over one shared pool (the drafter's groups
flagged), block hashes chained with vLLM's default hash (``sha256``) at the
block size by the engine's own hasher (looking ahead as configured), decode
context parallelism as the engine passes it (each spec's block size per
rank, a draft model's groups replicated), and no connector.  They are shared with
``benchmarks/bench_allocators.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvcheck.kinds import KINDS
from kvcheck.targets.scheduler import SchedulerDrivenTarget, block_ids
from kvcheck.targets.vllm_internals import (
    backward_ids,
    cache_entries,
    check_null_block,
    forward_ids,
    group_tables,
    hashed_blocks,
    holding_request_ids,
    ref_counts,
)
from kvcheck.vllm_releases import UnsupportedRelease, semantics_for, semantics_in_force
from kvmodel.config import TargetConfig
from kvmodel.fields import allocator_keywords
from kvmodel.group_spec import GroupSpec
from kvmodel.observation import CacheKey, Observation, block_keys
from kvmodel.ops import GroupIds
from kvmodel.semantics import KNOWN_VERSIONS, NEWEST, Semantics

INSTALL_HINT = (
    "install it into a separate venv with `scripts/install-vllm-cpu.sh VENV_DIR [VERSION]` "
    f"(CPU torch, the pins in requirements-vllm-cpu.txt, vllm=={NEWEST} or another known release "
    f"({', '.join(KNOWN_VERSIONS)}) --no-deps), then run kvcheck from that venv"
)
HASH_ALGORITHM = "sha256"
"""vLLM's default ``CacheConfig.prefix_caching_hash_algo``."""
MAX_MODEL_LEN = 4096
"""Far beyond any request the drivers build, so the length cap never binds."""
LAYER_LAYOUT = {"num_kv_heads": 1, "head_size": 8}
"""The smallest attention layer; page sizes never matter to the allocator."""


class VllmUnavailable(ImportError):
    """vLLM cannot serve as a target: it is not importable, or older than every release kvcheck knows."""


def check_vllm_version(installed: str, package_dir: Path | None = None) -> Semantics:
    """The semantics the vLLM target runs ``installed`` on (the nearest lower known release; see
    :mod:`kvcheck.vllm_releases`); :class:`VllmUnavailable` when it is older than every known release."""
    try:
        return semantics_for(installed, package_dir)
    except UnsupportedRelease as exc:
        raise VllmUnavailable(f"{exc}; {INSTALL_HINT}") from exc


_vllm: SimpleNamespace | None = None


def require_vllm() -> SimpleNamespace:
    """vLLM's allocator classes and helpers, imported on first use, with ``release`` (the known
    release whose semantics and internals it is read as) and ``semantics``."""
    global _vllm
    try:
        import vllm
    except ImportError as exc:
        raise VllmUnavailable(f"the vLLM target needs vllm, which cannot be imported ({exc}); {INSTALL_HINT}") from exc
    if _vllm is None or _vllm.version != vllm.__version__:
        semantics = semantics_in_force()
        if semantics.installed != vllm.__version__:
            # Imported from elsewhere than the installed distribution (a checkout on the path): read its own files.
            semantics = check_vllm_version(vllm.__version__, Path(vllm.__file__).parent)
        else:
            # Refuses a release older than every known one (the process semantics fall back to the newest).
            check_vllm_version(vllm.__version__)
        _vllm = _import_allocator(vllm.__version__)
        _vllm.semantics = semantics
        _vllm.release = semantics.release
    return _vllm


def _import_allocator(version: str) -> SimpleNamespace:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        CircularBufferSpec,
        CrossAttentionSpec,
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        MLAAttentionSpec,
        RSWASpec,
        SlidingWindowMLASpec,
        SlidingWindowSpec,
    )
    from vllm.v1.request import Request, RequestStatus

    hash_fn = get_hash_fn_by_name(HASH_ALGORITHM)
    # Once per process, as vLLM's engine core does before hashing any block.
    kv_cache_utils.init_none_hash(hash_fn)
    # The suite asks for refused resets on purpose; vLLM logs each one (and each success).
    logging.getLogger("vllm.v1.core.block_pool").setLevel(logging.ERROR)
    return SimpleNamespace(
        version=version,
        dtype=torch.float32,
        # As vLLM's engine stores a KV cache of --kv-cache-dtype fp8.
        fp8_dtype=STR_DTYPE_TO_TORCH_DTYPE["fp8"],
        hash_fn=hash_fn,
        hashers={},
        SamplingParams=SamplingParams,
        sampling_params=SamplingParams(max_tokens=MAX_MODEL_LEN),
        get_block_hash=kv_cache_utils.get_block_hash,
        maybe_convert_block_hash=kv_cache_utils.maybe_convert_block_hash,
        get_group_id=kv_cache_utils.get_group_id,
        get_request_block_hasher=kv_cache_utils.get_request_block_hasher,
        BlockPool=BlockPool,
        FreeKVCacheBlockQueue=kv_cache_utils.FreeKVCacheBlockQueue,
        KVCacheBlock=kv_cache_utils.KVCacheBlock,
        KVCacheManager=KVCacheManager,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        FullAttentionSpec=FullAttentionSpec,
        SlidingWindowSpec=SlidingWindowSpec,
        SlidingWindowMLASpec=SlidingWindowMLASpec,
        ChunkedLocalAttentionSpec=ChunkedLocalAttentionSpec,
        RSWASpec=RSWASpec,
        CircularBufferSpec=CircularBufferSpec,
        CrossAttentionSpec=CrossAttentionSpec,
        MLAAttentionSpec=MLAAttentionSpec,
        MambaSpec=MambaSpec,
        Request=Request,
        RequestStatus=RequestStatus,
    )


# -- construction (shared with the allocator benchmark) --------------------------


def attention_spec(group: GroupSpec, block_size: int) -> Any:
    """vLLM's attention spec of one group, with ``block_size`` tokens per block on one rank."""
    v = require_vllm()
    dtype = v.fp8_dtype if group.kv_cache_dtype == "fp8" else v.dtype
    layout: dict[str, Any] = {"block_size": block_size, "dtype": dtype, **LAYER_LAYOUT}
    if group.dcp_replicated:
        # As vLLM's model runner marks a draft model's layers running at DCP 1 under a DCP target.
        layout["dcp_sharded"] = False
    kind = KINDS.get(group.kind)
    if kind is None:
        raise ValueError(f"group kind {group.kind!r} has no vLLM attention spec")
    return kind.vllm_spec(v, group, layout)


def make_manager(
    groups: Sequence[GroupSpec],
    num_blocks: int,
    block_size: int | Sequence[int],
    enable_caching: bool,
    max_model_len: int = MAX_MODEL_LEN,
    use_eagle: bool = False,
    eagle_group_ids: Sequence[int] = (),
    num_hash_lookahead_tokens: int = 0,
    num_prefill_lookahead: int = 0,
    watermark: float = 0.0,
    max_in_flight_tokens: int | None = None,
    enable_kv_cache_events: bool = False,
    scheduler_block_size: int | None = None,
    hash_block_size: int | None = None,
    prefix_cache_retention_interval: int | None = None,
    dcp_world_size: int = 1,
    enable_mamba_shared_prefix_checkpoint: bool = False,
) -> Any:
    """A vLLM ``KVCacheManager``: one KV-cache group per spec, one shared pool of ``num_blocks``; the
    groups in ``eagle_group_ids`` hold a drafter's layers.  ``block_size`` is every group's, or one per
    group, on one rank; the scheduler and hash block sizes default to the (one) block size.
    ``prefix_cache_retention_interval`` is the cache configuration's, as vLLM's engine copies it into
    the KV cache configuration; ``dcp_world_size`` the decode context parallel world size;
    ``enable_mamba_shared_prefix_checkpoint`` the cache configuration's flag, which the manager narrows."""
    v = require_vllm()
    block_sizes = [block_size] * len(groups) if isinstance(block_size, int) else list(block_size)
    kv_cache_groups = [
        v.KVCacheGroupSpec([f"layers.{index}"], attention_spec(group, size), is_eagle_group=index in eagle_group_ids)
        for index, (group, size) in enumerate(zip(groups, block_sizes))
    ]
    config = v.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=kv_cache_groups,
        prefix_cache_retention_interval=prefix_cache_retention_interval,
    )
    return v.KVCacheManager(
        config,
        max_model_len=max_model_len,
        scheduler_block_size=block_sizes[0] if scheduler_block_size is None else scheduler_block_size,
        hash_block_size=block_sizes[0] if hash_block_size is None else hash_block_size,
        enable_caching=enable_caching,
        watermark=watermark,
        max_in_flight_tokens=max_in_flight_tokens,
        use_eagle=use_eagle,
        num_hash_lookahead_tokens=num_hash_lookahead_tokens,
        num_prefill_lookahead=num_prefill_lookahead,
        enable_kv_cache_events=enable_kv_cache_events,
        dcp_world_size=dcp_world_size,
        enable_mamba_shared_prefix_checkpoint=enable_mamba_shared_prefix_checkpoint,
    )


def manager_for(config: TargetConfig) -> Any:
    """The vLLM ``KVCacheManager`` a target configuration describes, as vLLM's engine builds it: the
    fields its manager takes by name (:func:`~kvmodel.fields.allocator_keywords`) and the derived sizes."""
    return make_manager(
        config.groups,
        block_size=config.spec_block_sizes,
        **allocator_keywords(config, "vllm"),
        scheduler_block_size=config.scheduler_block_size,
        hash_block_size=config.hash_size,
    )


def make_block_pool(num_blocks: int, enable_caching: bool, block_size: int) -> Any:
    """A bare vLLM ``BlockPool`` hashing at ``block_size``."""
    return require_vllm().BlockPool(num_blocks, enable_caching, hash_block_size=block_size)


def make_request(
    request_id: str,
    prompt: Sequence[int],
    block_size: int,
    num_hash_lookahead_tokens: int = 0,
    max_tokens: int | None = None,
) -> Any:
    """A waiting vLLM ``Request`` whose block hashes are chained every ``block_size`` tokens, each
    covering the ``num_hash_lookahead_tokens`` tokens after its block too.  With ``max_tokens`` it stops
    after sampling that many tokens (end-of-sequence tokens ignored); without, it never stops by itself."""
    v = require_vllm()
    key = (block_size, num_hash_lookahead_tokens)
    hasher = v.hashers.get(key)
    if hasher is None:
        hasher = v.hashers[key] = v.get_request_block_hasher(block_size, v.hash_fn, num_hash_lookahead_tokens)
    params = v.sampling_params if max_tokens is None else v.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return v.Request(request_id, list(prompt), params, None, block_hasher=hasher)


def free_block_ids(pool: Any) -> list[int]:
    """The ids in a vLLM free queue, head to tail."""
    return forward_ids(pool.free_block_queue)


# -- the target ---------------------------------------------------------------------


class VllmTarget(SchedulerDrivenTarget):
    """Drives vLLM's ``KVCacheManager`` through the operations as vLLM's scheduler would.

    A waiting request (``WAITING``, or ``PREEMPTED``) passes its local hit
    from ``get_computed_blocks``, with the external tokens, to
    ``allocate_slots``; admission makes it ``RUNNING``; preemption makes a
    running request ``PREEMPTED``; a finished one is ``FINISHED_STOPPED``.
    """

    name = "vllm"

    def __init__(self, config: TargetConfig, plant: Callable[[Any], None] | None = None, manager: Any = None) -> None:
        """``manager``: a manager built elsewhere (vLLM's own scheduler's) to drive and observe
        instead of one built for ``config``."""
        self._v = require_vllm()
        super().__init__(config)
        self.manager = manager_for(config) if manager is None else manager
        if plant is not None:
            plant(self.manager)  # a fault from kvcheck.faults, patched onto this instance only
        self.pool = self.manager.block_pool

    def _new_request(self, request_id: str, prompt: tuple[int, ...]) -> Any:
        return make_request(request_id, prompt, self.config.hash_size, self.config.num_hash_lookahead_tokens)

    def _get_num_cached_tokens(self, request: Any) -> int:
        return int(self.manager.get_num_cached_tokens(request))

    def _get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        hit_blocks, hit_length, request.shared_prefix_boundary = self.manager.get_computed_blocks(request)
        return hit_blocks, hit_length

    def _truncate_computed_blocks(self, blocks: Any, num_tokens: int) -> Any:
        return self.manager.truncate_computed_blocks(blocks, num_tokens)

    def _allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        hit: tuple[Any, int] | None,
        external: int,
        num_lookahead_tokens: int,
        delay_cache_blocks: bool = False,
    ) -> Any:
        keywords = self.allocate_slots_keywords(request, hit, external, num_lookahead_tokens, delay_cache_blocks)
        return self.manager.allocate_slots(request, num_new_tokens, **keywords)

    def allocate_slots_keywords(
        self,
        request: Any,
        hit: tuple[Any, int] | None,
        external: int,
        num_lookahead_tokens: int,
        delay_cache_blocks: bool = False,
    ) -> dict[str, Any]:
        """The keywords vLLM's scheduler passes to ``allocate_slots``: a waiting request's hit and
        external tokens, and the admission gates."""
        gates = self._admission_gates(request.request_id, request.status != self._v.RequestStatus.RUNNING)
        if hit is None:
            return {"new_computed_blocks": None, "num_lookahead_tokens": num_lookahead_tokens, **gates}
        hit_blocks, hit_length = hit
        return {
            "num_new_computed_tokens": hit_length,
            "new_computed_blocks": hit_blocks,
            "num_lookahead_tokens": num_lookahead_tokens,
            "num_external_computed_tokens": external,
            "delay_cache_blocks": delay_cache_blocks,
            # As vLLM's scheduler asks the connector which groups a load that lands later writes.
            "skip_zeroing_group_ids": self.config.async_loaded_group_ids if delay_cache_blocks else (),
            **gates,
        }

    def _free(self, request: Any) -> None:
        self.manager.free(request)

    def _pop_blocks_for_free(self, request: Any) -> list[Any]:
        return self.manager.pop_blocks_for_free(request)

    def _free_popped(self, popped: list[Any]) -> None:
        # As the scheduler drains a deferred free: tail first.
        self.pool.free_blocks(reversed(popped))

    def _take_block_copies(self) -> tuple[list[tuple[int, int]], list[Any]]:
        copies, retained = self.manager.take_kv_cache_block_copies()
        return [(copy.src_block_id, copy.dst_block_id) for copy in copies], retained

    def _take_new_block_ids(self) -> list[int]:
        return self.manager.take_new_block_ids()

    def _take_state_offloads(self) -> Mapping[str, Sequence[tuple[int, int, int]]]:
        return self.manager.take_boundary_state_offloads()

    def _finalize_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        return self.manager.finalize_partial_tail_offloads(request)

    def _free_retained(self, blocks: list[Any]) -> None:
        # As the scheduler releases the endpoints of copies it does not defer: in the order given.
        self.pool.free_blocks(blocks)

    def _new_step_starts(self) -> None:
        self.manager.new_step_starts()

    def _cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        self.manager.cache_blocks(request, num_computed_tokens)

    def _take_events(self) -> list[Any]:
        return self.manager.take_events()

    def _event_hash(self, block_hash: bytes) -> Any:
        return self._v.maybe_convert_block_hash(block_hash)

    def _evict(self, block_ids: set[int]) -> None:
        self.manager.evict_blocks(block_ids)

    def _reset_prefix_cache(self) -> bool:
        return bool(self.manager.reset_prefix_cache())

    def _block_ids(self, blocks: Any) -> GroupIds:
        return block_ids(blocks.blocks)  # a KVCacheBlocks wraps one tuple of blocks per group

    def _on_admitted(self, request: Any) -> None:
        request.status = self._v.RequestStatus.RUNNING

    def _on_preempted(self, request: Any, was_running: bool) -> None:
        if was_running:
            request.status = self._v.RequestStatus.PREEMPTED
            request.num_preemptions += 1

    def _on_finished(self, request: Any) -> None:
        request.status = self._v.RequestStatus.FINISHED_STOPPED

    # -- observation ----------------------------------------------------------

    def _table(self, request_id: str) -> GroupIds:
        return block_ids(group_tables(self.manager, request_id))

    def _holding_request_ids(self) -> list[str]:
        return holding_request_ids(self.manager)

    def _key(self, key: bytes) -> CacheKey:
        return self._v.get_group_id(key), self._prefix_of_hash[self._v.get_block_hash(key)]

    def observe(self) -> Observation:
        queue = self.pool.free_block_queue
        return Observation(
            free_order=tuple(forward_ids(queue)),
            free_order_backward=tuple(backward_ids(queue)),
            num_free=queue.num_free_blocks,
            ref_counts=ref_counts(self.pool),
            tables=self.tables(),
            cache_entries=frozenset(
                (*self._key(key), block_id) for key, block_id in cache_entries(self.pool, self._v.release)
            ),
            block_cache_keys=block_keys([(self._key(key), block_id) for key, block_id in hashed_blocks(self.pool)]),
            **self.pipeline_fields(),
        )

    def check_internal(self) -> None:
        """vLLM has no self-check; only the null block's standing is checked here."""
        check_null_block(self.pool)
