"""How a step settles a waiting request's hit and a connector's external tokens (``kvmodel.ops.plan_load``
and ``plan_step``): a load past a sub-block hit's tail cuts the hit back to the scheduler block boundary,
a shorter one is dropped, and beside align-mode Mamba groups a load ends inside a state block and the
step's chunk in the same block."""

from __future__ import annotations

import pytest

from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.ops import Schedule
from kvmodel.step_plans import ends_inside_state_blocks, plan_load, plan_step

FULL = TargetConfig(num_blocks=16, block_size=2, groups=(GroupSpec(kind="full"),), enable_caching=True).validate()
# Mamba states in 4-token blocks hashed every 2 tokens: sub-block hits, a scheduler block of 4.
STATES = TargetConfig(
    num_blocks=32,
    block_size=2,
    groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align", block_size=4)),
    enable_caching=True,
).validate()
# Two align-mode groups of 2- and 3-token blocks: a load must end inside a block of each.
TWO_SIZES = TargetConfig(
    num_blocks=32,
    block_size=1,
    groups=(GroupSpec(kind="mamba_align", block_size=2), GroupSpec(kind="mamba_align", block_size=3)),
    enable_caching=True,
).validate()


@pytest.mark.parametrize(
    ("hit", "requested", "settled"),
    [(4, 3, (4, 3)), (4, 20, (4, 5)), (0, 9, (0, 9)), (6, 0, (6, 0))],
)
def test_without_states_a_load_follows_the_hit_up_to_the_last_token(
    hit: int, requested: int, settled: tuple[int, int]
) -> None:
    assert plan_load(FULL, 10, hit, requested) == settled


@pytest.mark.parametrize(
    ("requested", "settled"),
    [
        (3, (4, 3)),  # past the 2-token tail: cut back to 4, the load covers 5 and 6
        (4, (4, 3)),  # would end on the state block boundary at 8: trimmed to 3, still past the tail
        (2, (6, 0)),  # no further than the tail: the hit is kept whole, nothing loaded
        (1, (6, 0)),
        (0, (6, 0)),
    ],
)
def test_a_load_cuts_a_sub_block_hit_back_only_when_it_reaches_past_the_hit(
    requested: int, settled: tuple[int, int]
) -> None:
    assert STATES.partial_hits and STATES.scheduler_block_size == 4
    assert plan_load(STATES, 12, 6, requested) == settled


def test_a_load_is_trimmed_until_it_ends_inside_a_block_of_every_state_group() -> None:
    assert [n for n in range(1, 13) if ends_inside_state_blocks(TWO_SIZES, n)] == [1, 5, 7, 11]
    assert plan_load(TWO_SIZES, 12, 0, 10) == (0, 7)
    assert plan_load(TWO_SIZES, 12, 0, 4) == (0, 1)
    assert plan_load(TWO_SIZES, 12, 6, 3) == (6, 1)  # 6 is a boundary of both: a load of 1 ends at 7


def test_the_steps_chunk_ends_in_the_block_holding_the_loads_last_state() -> None:
    amounts = plan_step(Schedule("r", 9, 3), STATES, 12, 0, 12, 0, 6)
    assert (amounts.hit_length, amounts.num_external_tokens, amounts.num_new_tokens) == (4, 3, 1)
    amounts = plan_step(Schedule("r", 9, 5), TWO_SIZES, 12, 0, 12, 0, 0)
    assert (amounts.hit_length, amounts.num_external_tokens, amounts.num_new_tokens) == (0, 5, 1)
