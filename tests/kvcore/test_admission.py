"""Admission of a waiting request: the whole request must fit, reserved blocks, the watermark.

The expected outcomes are those vLLM 0.33.0's own manager gives for the
same calls.
"""

from __future__ import annotations

import pytest

from kvcore import FullAttentionSpec, KVCacheConfig, KVCacheManager, Request, SlidingWindowSpec
from kvcore.errors import InvalidConfig

FULL = FullAttentionSpec(2)
WINDOW = SlidingWindowSpec(2, 8)


def admitted(config: KVCacheConfig, num_tokens: int, **gates: object) -> bool:
    """Whether a first step of 1 token of a ``num_tokens``-token waiting request is admitted."""
    manager = KVCacheManager(config)
    return manager.allocate_slots(Request("r0", [0] * num_tokens, 2), 1, **gates) is not None  # type: ignore[arg-type]


@pytest.mark.parametrize(("in_flight", "expected"), [(2, False), (1, True)])
def test_the_whole_request_must_fit_its_window_capped_by_the_tokens_in_flight(in_flight: int, expected: bool) -> None:
    """17 tokens: 9 full-attention blocks, and a window of 8 tokens capped at ceil((7 + f) / 2) + 1
    blocks: 6 with 2 tokens in flight (15 in all, above the 14 free), 5 with 1."""
    config = KVCacheConfig(num_blocks=15, groups=(FULL, WINDOW), max_in_flight_tokens=in_flight)
    assert admitted(config, 17, full_sequence_must_fit=True) is expected
    assert admitted(config, 17) is True  # without the gate only the step's own block counts


def test_reserved_blocks_stay_free() -> None:
    config = KVCacheConfig(num_blocks=4, groups=(FULL,))
    assert admitted(config, 6, reserved_blocks=2) is True
    manager = KVCacheManager(config)
    assert manager.allocate_slots(Request("r0", [0] * 6, 2), 6, reserved_blocks=1) is None  # 3 needed, 3 - 1 free


def test_the_watermark_applies_to_a_waiting_request_while_another_runs() -> None:
    """A quarter of 8 blocks is a watermark of 2: a waiting request needing 6 of the 7 free blocks is
    refused while another runs, admitted when none does, and a running request never pays it."""
    config = KVCacheConfig(num_blocks=8, groups=(FULL,), watermark=0.25)
    assert admitted(config, 12, has_scheduled_reqs=False) is True
    manager = KVCacheManager(config)
    request = Request("r0", [0] * 12, 2)
    assert manager.allocate_slots(request, 12, has_scheduled_reqs=True) is None
    assert manager.allocate_slots(request, 4, has_scheduled_reqs=True) is not None  # 2 + 2 <= 7
    request.num_computed_tokens, request.waiting = 4, False
    assert manager.allocate_slots(request, 8) is not None  # running: 4 more blocks of the 5 free


def test_a_bad_watermark_is_refused() -> None:
    with pytest.raises(InvalidConfig, match="watermark"):
        KVCacheConfig(num_blocks=8, groups=(FULL,), watermark=1.0)
