"""The fault catalogue: realistic allocator bugs, planted into a kvcore manager from outside.

A fault patches one instance of :class:`kvcore.KVCacheManager` (its pool,
coordinator or managers) right after construction; kvcore itself carries no
switch for it.  Each fault is a bug an allocator engineer could plausibly
write; together they prove the suite catches the classes of bug it exists
for (the kill matrix).  Many are expressed against vLLM too, planted the same
way into one vLLM ``KVCacheManager`` (the installed package is never edited).

Each family module of this package declares the faults about one part of the
allocator, a fault's description, kvcore plant and vLLM plant side by side;
the catalogues below are built from them.  A plant replaces methods of the one
instance it is given, or moves the instance to a subclass of its own class (and
its coordinator's record of the class), with a comment naming the bug; classes
are never patched.
"""

from __future__ import annotations

from typing import Any

from kvcheck.faults import (
    connector,
    dcp,
    events,
    group_kinds,
    hit_lookup,
    mamba,
    mamba_checkpoints,
    pool,
    prefix_cache,
    speculative,
    sub_block_hits,
    windows,
    zeroing,
)
from kvcheck.faults.fault import Fault as Fault
from kvcheck.faults.fault import FaultDeclaration
from kvmodel.config import TargetConfig

FAMILIES = (
    pool,
    prefix_cache,
    hit_lookup,
    windows,
    speculative,
    connector,
    events,
    group_kinds,
    dcp,
    mamba,
    mamba_checkpoints,
    sub_block_hits,
    zeroing,
)
"""The family modules; each declares its faults in its ``FAMILY``."""

DECLARED: tuple[FaultDeclaration, ...] = tuple(fault for family in FAMILIES for fault in family.FAMILY.faults)
"""Every declared fault, family by family."""


FAULTS: dict[str, Fault] = {
    fault.name: Fault(name=fault.name, description=fault.description, plant=fault.kvcore, layout=fault.layout)
    for fault in sorted(DECLARED, key=lambda fault: fault.number)
}
"""Every fault as planted into kvcore, in catalogue order."""

VLLM_FAULTS: dict[str, Fault] = {
    fault.name: Fault(name=fault.name, description=plant.description, plant=plant.plant, layout=fault.layout)
    for plant, fault in sorted(
        ((fault.vllm, fault) for fault in DECLARED if fault.vllm is not None), key=lambda pair: pair[0].number
    )
}
"""The faults expressed against vLLM, as planted into vLLM, in the vLLM catalogue's order."""


def get_fault(name: str) -> Fault:
    try:
        return FAULTS[name]
    except KeyError:
        raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(sorted(FAULTS))}") from None


def vllm_target_with(name: str) -> Any:
    """A vLLM target factory with the named seed fault planted."""
    from kvcheck.targets.vllm_target import VllmTarget

    try:
        fault = VLLM_FAULTS[name]
    except KeyError:
        raise ValueError(f"fault {name!r} is not expressed against vLLM; these are: {', '.join(VLLM_FAULTS)}") from None

    def make(config: TargetConfig) -> VllmTarget:
        return VllmTarget(config, plant=fault.plant)

    return make
