"""The request: a sequence of tokens whose KV cache the manager tracks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvcore.errors import InvalidArgument
from kvcore.hashing import BlockHash, ExtraKeys, hash_request_blocks


class Request:
    """A request as the KV-cache manager sees it.

    ``all_token_ids`` is the prompt followed by the generated tokens.
    ``block_hashes`` holds the hash of every full block of ``all_token_ids``
    (at ``block_size`` granularity) and is kept up to date as tokens are
    appended; with ``num_hash_lookahead_tokens`` (L) each hash also covers
    the L tokens after its block (the engine's lookahead block hashes for an
    EAGLE/MTP drafter), and a block is hashed once those exist.  ``num_computed_tokens`` is advanced by the caller (the
    scheduler) once a step has computed its tokens, and reset to 0 on
    preemption.  Under async scheduling the scheduler advances it when a
    step is *scheduled*, and ``num_in_flight_tokens`` counts the tokens of
    steps scheduled but not yet processed: the manager only treats
    ``num_computed_tokens - num_in_flight_tokens`` tokens as done when it
    frees blocks that left the attention window.  ``waiting`` is set while
    the request waits to be scheduled (new or preempted): the scheduler
    clears it once the request runs, and the watermark applies only to
    waiting requests.  ``shared_prefix_boundary`` is set by each prefix
    lookup (:meth:`~kvcore.KVCacheManager.get_computed_blocks`): where a
    prefix some group found cached ends when a sparsely caching group held
    the hit shorter (0 otherwise), so that a sliding window under a
    retention interval keeps the blocks a hit there needs.
    ``prefix_cache_hit_limit`` bounds the tokens a prefix hit may cover
    (0: the request reads nothing from the prefix cache, as a request
    skipping cache reads; ``None``: no bound but ``num_tokens - 1``).
    """

    __slots__ = (
        "request_id",
        "block_size",
        "extra_keys",
        "num_hash_lookahead_tokens",
        "num_prompt_tokens",
        "all_token_ids",
        "block_hashes",
        "num_computed_tokens",
        "num_in_flight_tokens",
        "waiting",
        "shared_prefix_boundary",
        "prefix_cache_hit_limit",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        block_size: int,
        extra_keys: ExtraKeys | None = None,
        num_hash_lookahead_tokens: int = 0,
        prefix_cache_hit_limit: int | None = None,
    ) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise InvalidArgument("block_size", block_size, "must be an int >= 1")
        if not isinstance(num_hash_lookahead_tokens, int) or num_hash_lookahead_tokens < 0:
            raise InvalidArgument("num_hash_lookahead_tokens", num_hash_lookahead_tokens, "must be an int >= 0")
        if prefix_cache_hit_limit is not None and (
            not isinstance(prefix_cache_hit_limit, int) or prefix_cache_hit_limit < 0
        ):
            raise InvalidArgument("prefix_cache_hit_limit", prefix_cache_hit_limit, "must be None or an int >= 0")
        if len(prompt_token_ids) == 0:
            raise InvalidArgument("prompt_token_ids", list(prompt_token_ids), "a prompt needs at least one token")
        self.request_id = request_id
        self.block_size = block_size
        self.extra_keys = extra_keys
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.num_prompt_tokens = len(prompt_token_ids)
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.block_hashes: list[BlockHash] = hash_request_blocks(
            self.all_token_ids, block_size, extra_keys, num_lookahead_tokens=num_hash_lookahead_tokens
        )
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.waiting = True
        self.shared_prefix_boundary = 0
        self.prefix_cache_hit_limit = prefix_cache_hit_limit

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def max_cache_hit_length(self, bound: int | None = None) -> int:
        """The longest prefix hit this request may take: ``num_tokens - 1`` (its last token is always
        computed, to produce logits), its ``prefix_cache_hit_limit`` and ``bound``, whichever is least."""
        limits = (self.num_tokens - 1, self.prefix_cache_hit_limit, bound)
        return min(limit for limit in limits if limit is not None)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Append generated tokens and hash the blocks they complete."""
        if isinstance(token_ids, int):
            self.all_token_ids.append(token_ids)
        else:
            self.all_token_ids.extend(token_ids)
        lookahead = self.num_hash_lookahead_tokens
        if len(self.all_token_ids) >= (len(self.block_hashes) + 1) * self.block_size + lookahead:
            self.block_hashes = hash_request_blocks(
                self.all_token_ids, self.block_size, self.extra_keys, self.block_hashes, lookahead
            )

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens})"
        )
