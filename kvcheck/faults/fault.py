"""A fault as its family module declares it, and as a catalogue lists it for one target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import kvcore
from kvcheck.coverage.labels import GROUP_LAYOUTS
from kvcheck.targets.kvcore_target import KvcoreTarget
from kvmodel.config import TargetConfig


@attrs.frozen
class Fault:
    """A named bug: ``plant`` rewires one manager instance to carry it."""

    name: str
    description: str
    plant: Callable[[kvcore.KVCacheManager], None]
    layout: int | str | None = None
    """Where the manager machine hunts it (see :attr:`FaultDeclaration.layout`)."""

    def make_manager(self, config: kvcore.KVCacheConfig) -> kvcore.KVCacheManager:
        manager = kvcore.KVCacheManager(config)
        self.plant(manager)
        return manager

    def kvcore_target(self, config: TargetConfig) -> KvcoreTarget:
        """A kvcore target whose manager carries this fault."""
        return KvcoreTarget(config, manager_factory=self.make_manager)


@attrs.frozen
class VllmPlant:
    """A fault expressed against vLLM: its number in the vLLM catalogue, the bug as vLLM's code would
    carry it, and the function that plants it into one vLLM ``KVCacheManager``."""

    number: int
    description: str
    plant: Callable[[Any], None]


@attrs.frozen
class FaultDeclaration:
    """One fault: its number in the catalogue (the order ``kvcheck faults`` and the kill matrix list
    it), its name and description, its kvcore plant, and its vLLM plant when it has one."""

    number: int
    name: str
    description: str
    kvcore: Callable[[kvcore.KVCacheManager], None]
    vllm: VllmPlant | None = None
    layout: int | str | None = attrs.field(default=None, validator=attrs.validators.in_(GROUP_LAYOUTS))
    """The manager machine's layout it is hunted in: ``None`` for groups drawn from 1 to 4, or one
    of the machine's own layouts (``"mamba"``, ``"samba"``) when the fault bites only in draws those
    layouts make often and the others rarely (a few in 1,000 examples).  ``bench_detection.py`` runs
    each fault there."""


@attrs.define
class Family:
    """The faults one family module declares, in the order it declares them."""

    faults: list[FaultDeclaration] = attrs.Factory(list)

    def declare(self, fault: FaultDeclaration) -> None:
        self.faults.append(fault)
