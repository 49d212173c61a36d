"""The scheduler a kvcheck configuration describes: vLLM's own ``Scheduler``, built offline on CPU.

vLLM builds its scheduler from an engine configuration, which starts from a model's: a tiny Llama
``config.json``, written once into a cache folder, stands for the model (no weights, no tokenizer).
The KV cache configuration is made by hand, one KV cache group per kvcheck group with the spec
:func:`kvcheck.targets.vllm_target.attention_spec` gives it, over ``num_blocks`` blocks.

Not every configuration kvcheck draws can be run through the scheduler yet: :func:`refusal` names the
first field that cannot, and why.  Every field of :class:`~kvmodel.config.TargetConfig` is either
driven (:data:`DRIVEN_FIELDS`) or refused away from its default (:data:`NOT_DRIVEN_YET`); a test holds
the two to the configuration's fields.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import attrs

from kvcheck.targets.vllm_target import MAX_MODEL_LEN, attention_spec, require_vllm
from kvmodel.config import TargetConfig

POLICIES = ("fcfs", "priority")


@attrs.frozen
class SchedulerSettings:
    """What the scheduler decides with, beside the allocator's configuration: its token budget per
    step (a prompt longer than what is left of it is prefilled in chunks), the most requests it runs
    at once, and its policy (``fcfs``: arrival order, preempting the last running request;
    ``priority``: the lowest priority first)."""

    max_num_batched_tokens: int = 16
    max_num_seqs: int = 8
    policy: str = attrs.field(default="fcfs", validator=attrs.validators.in_(POLICIES))

    def __attrs_post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: {self.max_num_seqs} is below the minimum of 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens: {self.max_num_batched_tokens} is below max_num_seqs "
                f"({self.max_num_seqs}), which vLLM refuses"
            )


DRIVEN_FIELDS = frozenset(
    {
        "num_blocks",
        "block_size",
        "enable_caching",
        "groups",
        "reserve_full_sequence",
        "watermark",
        "hash_block_size",
        "prefix_cache_retention_interval",
        "max_in_flight_tokens",
    }
)
"""The configuration's fields the scheduler runs with as they are (``max_in_flight_tokens`` must be
the one the scheduler's budget gives: :func:`scheduled_config`)."""

NOT_DRIVEN_YET = {
    "use_eagle": "speculative decoding is not driven through the scheduler yet",
    "num_lookahead_tokens": "speculative decoding is not driven through the scheduler yet",
    "eagle_group_ids": "speculative decoding is not driven through the scheduler yet",
    "num_hash_lookahead_tokens": "speculative decoding is not driven through the scheduler yet",
    "num_prefill_lookahead": "speculative decoding is not driven through the scheduler yet",
    "async_scheduling": "the asynchronous scheduler is not driven yet (its batches of several requests "
    "in flight have no kvcheck operation yet)",
    "defer_block_free": "deferred frees come with the asynchronous scheduler, not driven yet",
    "reserved_blocks": "the scheduler reserves blocks for parked asynchronous loads itself",
    "enable_kv_cache_events": "KV cache events are not read from the scheduler's manager yet",
    "num_encoder_tokens": "encoder inputs are not part of the workloads yet",
    "dcp_world_size": "decode context parallelism is not built for the scheduler yet",
    "enable_mamba_shared_prefix_checkpoint": "align-mode Mamba groups are not driven through the scheduler yet",
}
"""The configuration's fields the scheduler cannot run yet away from their defaults, and why."""


def scheduled_config(config: TargetConfig, settings: SchedulerSettings) -> TargetConfig:
    """``config`` as vLLM's scheduler runs it: the tokens a request may have in flight are bounded by
    one token budget per batch the engine runs at once (one, synchronously), as vLLM's engine sets
    its ``max_in_flight_tokens``."""
    return attrs.evolve(config, max_in_flight_tokens=settings.max_num_batched_tokens)


def refusal(config: TargetConfig, settings: SchedulerSettings) -> tuple[str, str] | None:
    """The first field of ``config`` the scheduler cannot run with ``settings`` yet, and why; ``None``
    when it can."""
    defaults = {field.name: field.default for field in attrs.fields(TargetConfig)}
    for name, reason in NOT_DRIVEN_YET.items():
        if getattr(config, name) != defaults[name]:
            return name, reason
    if config.max_in_flight_tokens != settings.max_num_batched_tokens:
        return "max_in_flight_tokens", (
            f"{config.max_in_flight_tokens}, but the scheduler's budget bounds tokens in flight at "
            f"{settings.max_num_batched_tokens} (see scheduled_config)"
        )
    for index, group in enumerate(config.groups):
        if group.rules.aligned_states:
            return f"groups[{index}].kind", (
                f"{group.kind}: its copies, offers and checkpoints are handed over once per scheduler "
                "step, and are not compared per step yet"
            )
        if group.rules.encoder_blocks:
            return f"groups[{index}].kind", f"{group.kind}: encoder inputs are not part of the workloads yet"
        if group.kv_cache_dtype != "auto":
            return f"groups[{index}].kv_cache_dtype", (
                f"{group.kv_cache_dtype}: blocks to zero are handed over once per scheduler step, and are "
                "not compared per step yet"
            )
    return None


def build_scheduler(config: TargetConfig, settings: SchedulerSettings) -> Any:
    """vLLM's ``Scheduler`` for ``config`` (as :func:`scheduled_config` gives it) with ``settings``;
    ``ValueError`` naming the field when :func:`refusal` refuses the configuration."""
    refused = refusal(config, settings)
    if refused is not None:
        field, reason = refused
        raise ValueError(f"{field}: {reason}")
    v = require_vllm()
    _prepare_environment(v.version)
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(
        model=str(_model_folder(v.version)),
        skip_tokenizer_init=True,
        max_model_len=MAX_MODEL_LEN,
        dtype="float32",
        seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_model_len=MAX_MODEL_LEN,
        is_encoder_decoder=False,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_chunked_prefill=True,
        async_scheduling=False,
        policy=settings.policy,
        scheduler_reserve_full_isl=config.reserve_full_sequence,
        watermark=config.watermark,
    )
    cache_config = CacheConfig(
        block_size=config.scheduler_block_size,
        cache_dtype="auto",
        enable_prefix_caching=config.enable_caching,
    )
    vllm_config = _engine_config(
        VllmConfig,
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=scheduler_config,
        parallel_config=ParallelConfig(),
        device_config=DeviceConfig(device="cpu"),
    )
    vllm_config.cache_config.num_gpu_blocks = config.num_blocks
    kv_cache_config = v.KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            v.KVCacheGroupSpec([f"model.layers.{index}.self_attn.attn"], attention_spec(group, size))
            for index, (group, size) in enumerate(zip(config.groups, config.spec_block_sizes, strict=True))
        ],
        prefix_cache_retention_interval=config.prefix_cache_retention_interval,
    )
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=config.scheduler_block_size,
        hash_block_size=config.hash_size,
        log_stats=False,
    )


TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": MAX_MODEL_LEN,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
"""The model vLLM's configuration is built for: the smallest Llama it accepts.  Only its length
limit and layer count reach the scheduler; nothing loads weights."""


def cache_folder() -> Path:
    """Where vLLM keeps what it learns of a model's architecture (``VLLM_CACHE_ROOT``), and the tiny
    model lives: a folder of the system's temporary folder, kept between runs (the first build in
    it inspects the architecture in a subprocess, some seconds; later ones read what it wrote)."""
    return Path(tempfile.gettempdir()) / "kvcheck-vllm-cache"


def _prepare_environment(version: str) -> None:
    """Offline, and caching in :func:`cache_folder` (a folder per vLLM release, whose entries would
    otherwise replace each other's) rather than the home folder, unless the caller chose otherwise."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_folder() / f"vllm-{version}"))


def _model_folder(version: str) -> Path:
    folder = cache_folder() / f"tiny-llama-{version}"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.json"
    text = json.dumps(TINY_LLAMA, indent=1)
    if not config.exists() or config.read_text() != text:
        config.write_text(text)
    return folder


def _engine_config(factory: Any, **parts: Any) -> Any:
    """vLLM's engine configuration.  On an x86 CPU vLLM 0.34.0 refuses to configure itself without
    Triton's CPU backend, which only its model runner needs: the check is told Triton is there while
    the configuration is built, and the flag restored after."""
    import vllm.triton_utils as triton_utils

    had_triton = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        return factory(**parts)
    finally:
        triton_utils.HAS_TRITON = had_triton
