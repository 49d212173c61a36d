"""kvcore: a paged KV-cache block allocator with vLLM v1's semantics."""

from kvcore.block import NULL_BLOCK_ID, KVBlock
from kvcore.block_pool import BlockPool
from kvcore.config import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from kvcore.errors import (
    InvalidArgument,
    InvalidConfig,
    KVCoreError,
    OutOfBlocks,
    RefCountUnderflow,
    RequestTooLong,
    UnknownBlock,
)
from kvcore.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvcore.free_queue import FreeBlockQueue
from kvcore.hashing import hash_block_tokens, hash_request_blocks
from kvcore.kv_cache_manager import KVCacheManager, hit_block_ids
from kvcore.request import Request

__all__ = [
    "NULL_BLOCK_ID",
    "AllBlocksCleared",
    "AttentionSpec",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "FreeBlockQueue",
    "FullAttentionSpec",
    "InvalidArgument",
    "InvalidConfig",
    "KVBlock",
    "KVCacheConfig",
    "KVCacheEvent",
    "KVCacheManager",
    "KVCoreError",
    "MLAAttentionSpec",
    "MambaSpec",
    "OutOfBlocks",
    "RSWASpec",
    "RefCountUnderflow",
    "Request",
    "RequestTooLong",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UnknownBlock",
    "hash_block_tokens",
    "hash_request_blocks",
    "hit_block_ids",
]
