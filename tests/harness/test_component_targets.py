"""Which free-queue and block-pool targets a --target names."""

from __future__ import annotations

import pytest

from kvcheck.targets import component_allocators, load_pool, load_queue
from kvcheck.targets.kvcore_pool import KvcorePool
from kvcheck.targets.kvcore_queue import KvcoreQueue


@pytest.mark.parametrize(
    ("spec", "allocators"),
    [
        ("kvcore", ["kvcore"]),
        ("vllm", ["vllm"]),
        ("kvcore+vllm", ["kvcore", "vllm"]),
        ("mypkg.alloc:make+kvcore", ["kvcore"]),
        ("mypkg.alloc:make", []),
    ],
)
def test_component_allocators_are_the_built_in_names_of_the_target(spec: str, allocators: list[str]) -> None:
    assert component_allocators(spec) == allocators


def test_kvcore_names_its_queue_and_pool_targets() -> None:
    assert load_queue("kvcore") is KvcoreQueue
    assert load_pool("kvcore") is KvcorePool


@pytest.mark.parametrize("load", [load_queue, load_pool])
def test_an_unknown_allocator_is_refused_by_name(load: object) -> None:
    with pytest.raises(ValueError, match=r"allocator 'mypkg.alloc:make': the .* machine drives kvcore or vllm"):
        load("mypkg.alloc:make")  # type: ignore[operator]
