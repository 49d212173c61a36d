"""Prefill chunks beside an align-mode Mamba group end where states can exist: on block boundaries."""

from __future__ import annotations

import pytest

from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.ops import Schedule
from kvmodel.step_plans import ScheduleAmounts, split_at_mamba_states

CONFIG = TargetConfig(
    num_blocks=16, block_size=4, groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")), enable_caching=True
)


def chunk(start: int, num_new_tokens: int, num_tokens: int = 10, junction: int = 0, prompt: int = 10) -> int:
    """The new tokens of a step starting at ``start`` asking for ``num_new_tokens`` (already capped at
    the request's tokens, as ``plan_schedule`` caps them)."""
    op = Schedule("r", num_new_tokens)
    new = min(num_new_tokens, num_tokens - start)
    amounts = split_at_mamba_states(ScheduleAmounts(new, 0), op, start, num_tokens, prompt, junction, CONFIG)
    return amounts.num_new_tokens


@pytest.mark.parametrize(
    ("start", "asked", "expected", "why"),
    [
        (0, 7, 4, "a chunk reaching a block boundary ends on it"),
        (0, 3, 3, "a step's budget below a block advances inside the block"),
        (3, 3, 1, "a chunk starting inside a block stops at the next boundary"),
        (0, 20, 8, "a prefill reaching its end stops at the last boundary it can cache (below the last token)"),
        (8, 20, 2, "past the last cacheable boundary the prefill ends"),
    ],
)
def test_prefill_chunks_end_on_state_boundaries(start: int, asked: int, expected: int, why: str) -> None:
    assert chunk(start, asked) == expected, why


def test_a_chunk_stops_at_the_block_below_a_shared_prefix() -> None:
    """A lookup found 6 tokens cached in one group past the hit: the chunk stops at the block boundary
    below them (4), not at the last cacheable one (8)."""
    assert chunk(0, 10, junction=6) == 4
    assert chunk(4, 10, junction=6) == 4  # past the junction's block: on to the last cacheable boundary


def test_decode_and_resumed_output_are_not_split() -> None:
    """At the prompt's end a step decodes as asked; a resumed request replays its output tokens (all
    but the last) as prefill, split like the prompt."""
    assert chunk(10, 1, num_tokens=11) == 1
    assert chunk(0, 20, num_tokens=14) == 12


CHECKPOINTS = TargetConfig(
    num_blocks=16,
    block_size=4,
    groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", prefill_checkpoint_alignment=1)),
    enable_caching=True,
)


@pytest.mark.parametrize(
    ("start", "asked", "with_checkpoints", "without", "why"),
    [
        (
            0,
            20,
            10,
            8,
            "a chunk reaching the prefill's end runs past the last cacheable boundary: the backend "
            "exports the state at 8 inside it",
        ),
        (4, 20, 6, 4, "from a block boundary, a block or more below the checkpoint: the same"),
        (1, 20, 3, 3, "a chunk starting off the hash boundaries exports nothing: it stops at the next block"),
        (0, 7, 4, 4, "a chunk short of the prefill's end keeps its block-boundary stop"),
    ],
)
def test_a_chunk_exporting_its_checkpoint_is_not_split(
    start: int, asked: int, with_checkpoints: int, without: int, why: str
) -> None:
    op = Schedule("r", asked)
    amounts = ScheduleAmounts(min(asked, 10 - start), 0)
    assert split_at_mamba_states(amounts, op, start, 10, 10, 0, CHECKPOINTS).num_new_tokens == with_checkpoints, why
    assert split_at_mamba_states(amounts, op, start, 10, 10, 0, CONFIG).num_new_tokens == without, why


@pytest.mark.parametrize(("alignment", "expected"), [(1, 10), (2, 10), (4, 10), (8, 10), (3, 8), (5, 8)])
def test_a_checkpoint_off_the_backends_alignment_is_not_exported(alignment: int, expected: int) -> None:
    """The checkpoint at 8 lies 8 tokens past a chunk starting at 0: a backend exporting states every 1,
    2, 4 or 8 tokens exports it and the chunk runs on to the prefill's end; one exporting every 3 or 5
    tokens does not, and the chunk stops at the last cacheable boundary, as without checkpoints."""
    groups = (GroupSpec(kind="full"), GroupSpec(kind="mamba_align", prefill_checkpoint_alignment=alignment))
    config = TargetConfig(num_blocks=16, block_size=4, groups=groups, enable_caching=True)
    amounts = split_at_mamba_states(ScheduleAmounts(10, 0), Schedule("r", 20), 0, 10, 10, 0, config)
    assert amounts.num_new_tokens == expected
