"""Block hashing: deterministic across processes, and sensitive to tokens, parent and extra keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcore import Request, hash_block_tokens, hash_request_blocks

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENS = list(range(10, 22))

HASH_IN_CHILD = """
from kvcore import hash_request_blocks
for block_hash in hash_request_blocks(list(range(10, 22)), 4, ("adapter", 7, b"raw")):
    print(block_hash.hex())
"""


@pytest.mark.parametrize("hash_seed", ["0", "4242"])
def test_hashes_are_the_same_in_another_process_with_another_hash_seed(hash_seed: str) -> None:
    """A fresh interpreter with a different PYTHONHASHSEED computes the same block hashes as this process."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    completed = subprocess.run(
        [sys.executable, "-c", HASH_IN_CHILD], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    )
    in_process = [block_hash.hex() for block_hash in hash_request_blocks(TOKENS, 4, ("adapter", 7, b"raw"))]
    assert completed.stdout.split() == in_process
    assert len(in_process) == 3


def test_only_full_blocks_are_hashed_and_each_chains_its_parent() -> None:
    """Ten tokens with block size 4 give two hashes, the second computed from the first."""
    hashes = hash_request_blocks(TOKENS[:10], 4)
    assert len(hashes) == 2
    assert hashes[0] == hash_block_tokens(None, TOKENS[0:4])
    assert hashes[1] == hash_block_tokens(hashes[0], TOKENS[4:8])


def test_a_different_parent_gives_a_different_hash() -> None:
    """The same tokens under another parent, or as a first block, hash differently."""
    parent_a = hash_block_tokens(None, [1, 2, 3, 4])
    parent_b = hash_block_tokens(None, [1, 2, 3, 5])
    assert parent_a != parent_b
    child = [7, 8, 9, 10]
    assert hash_block_tokens(parent_a, child) != hash_block_tokens(parent_b, child)
    assert hash_block_tokens(parent_a, child) != hash_block_tokens(None, child)
    # Equal blocks at different positions of one prompt differ too.
    repeated = hash_request_blocks([7, 8, 9, 10, 7, 8, 9, 10], 4)
    assert repeated[0] != repeated[1]


@pytest.mark.parametrize(
    ("extra_a", "extra_b"),
    [
        (None, ("adapter",)),
        (("adapter-1",), ("adapter-2",)),
        (("1",), (1,)),
        (("ab",), (b"ab",)),
        (("a", "b"), ("ab",)),
        ((1, 2), (12,)),
    ],
)
def test_different_extra_keys_give_different_hashes(extra_a: tuple[object, ...], extra_b: tuple[object, ...]) -> None:
    """Extra keys are part of the hash, with types and boundaries kept apart."""
    assert hash_block_tokens(None, [1, 2, 3, 4], extra_a) != hash_block_tokens(None, [1, 2, 3, 4], extra_b)  # type: ignore[arg-type]


def test_equal_inputs_give_equal_hashes_in_one_process() -> None:
    """Hashing is a pure function: the same tokens, parent and extra keys give the same bytes."""
    assert hash_request_blocks(TOKENS, 4, ("x",)) == hash_request_blocks(list(TOKENS), 4, ("x",))
    assert hash_block_tokens(None, [1, 2, 3, 4]) == hash_block_tokens(None, (1, 2, 3, 4))


def test_a_request_hashes_blocks_as_generated_tokens_fill_them() -> None:
    """Appending tokens hashes each newly completed block exactly as hashing the whole sequence would."""
    request = Request("r", TOKENS[:6], 4, extra_keys=("k",))
    assert request.block_hashes == hash_request_blocks(TOKENS[:6], 4, ("k",))
    assert len(request.block_hashes) == 1
    request.append_output_token_ids(TOKENS[6])
    assert len(request.block_hashes) == 1
    request.append_output_token_ids(TOKENS[7:12])
    assert request.block_hashes == hash_request_blocks(TOKENS, 4, ("k",))
    assert len(request.block_hashes) == 3
