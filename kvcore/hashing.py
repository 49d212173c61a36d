"""Block hashing for the prefix cache.

A block's hash fingerprints the whole prefix that ends with it: it chains the
parent block's hash, the token ids of the block, and optional extra keys (for
example an adapter name).  Hashes are SHA-256 digests of a fixed byte
encoding, so they are the same in every process and every run (Python's
``hash`` is salted per process and would not be).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from kvcore.errors import InvalidArgument

BlockHash = bytes
BlockHashWithGroup = tuple[bytes, int]
"""A block hash paired with the KV-cache group id it was cached for."""

ExtraKeys = tuple[str | int | bytes, ...]

ROOT_HASH: BlockHash = hashlib.sha256(b"kvcore/root-block-hash/v1").digest()
"""The parent hash of a request's first block."""


def _encode_extra_keys(extra_keys: ExtraKeys | None) -> bytes:
    if not extra_keys:
        return b""
    parts = []
    for key in extra_keys:
        if isinstance(key, bytes):
            parts.append(b"b" + len(key).to_bytes(4, "little") + key)
        elif isinstance(key, str):
            raw = key.encode()
            parts.append(b"s" + len(raw).to_bytes(4, "little") + raw)
        elif isinstance(key, int):
            parts.append(b"i" + str(key).encode() + b";")
        else:
            raise InvalidArgument("extra_keys", key, "must be str, int or bytes")
    return b"|" + b"".join(parts)


def hash_block_tokens(
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: ExtraKeys | None = None,
    lookahead_token_ids: Sequence[int] = (),
) -> BlockHash:
    """Hash one full block given its parent's hash (``None`` for the first block).

    ``lookahead_token_ids`` are the tokens right after the block that the
    hash also covers (an EAGLE/MTP drafter's KV at the block's last position
    depends on them)."""
    try:
        encoded = array("q", token_ids).tobytes()
        lookahead = array("q", lookahead_token_ids).tobytes()
    except (OverflowError, TypeError) as exc:
        raise InvalidArgument("token_ids", list(token_ids), "must be 64-bit integers") from exc
    digest = hashlib.sha256(parent_hash or ROOT_HASH)
    digest.update(encoded)
    digest.update(_encode_extra_keys(extra_keys))
    if lookahead:
        digest.update(b"L" + lookahead)
    return digest.digest()


def hash_request_blocks(
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: ExtraKeys | None = None,
    known: Sequence[BlockHash] = (),
    num_lookahead_tokens: int = 0,
) -> list[BlockHash]:
    """The hashes of every full block of ``token_ids``.

    ``known`` are hashes already computed for the leading blocks; they are
    kept and only the blocks after them are hashed.  With
    ``num_lookahead_tokens`` (L) each hash also covers the L tokens after its
    block, so a block is hashed only once those exist.
    """
    hashes = list(known)
    parent = hashes[-1] if hashes else None
    start = len(hashes) * block_size
    while start + block_size + num_lookahead_tokens <= len(token_ids):
        end = start + block_size
        lookahead = token_ids[end : end + num_lookahead_tokens]
        parent = hash_block_tokens(parent, token_ids[start:end], extra_keys, lookahead)
        hashes.append(parent)
        start += block_size
    return hashes
