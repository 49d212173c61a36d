"""Target adapters: one allocator behind one small interface.

A target is built from a :class:`~kvmodel.config.TargetConfig`, applies
operations (:mod:`kvmodel.ops`) and reports :class:`~kvmodel.observation.Observation`
snapshots.  Machines, traces and drivers only ever talk to this interface.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

# The interface lives in its own module (so that the differential target, which the loader below builds,
# imports it without importing this package); importers name it from here.
from kvcheck.targets.interface import Target as Target
from kvcheck.targets.interface import TargetFactory as TargetFactory


def load_target(spec: str) -> TargetFactory:
    """The target factory named by ``spec``: ``kvcore``, ``vllm``, ``package.module:factory``,
    or several of those joined by ``+`` (a differential target comparing them step by step)."""
    if "+" in spec:
        from kvcheck.targets.differential import DifferentialTarget

        parts = [(part, load_target(part)) for part in spec.split("+")]
        return lambda config: DifferentialTarget(config, parts)
    if spec == "kvcore":
        from kvcheck.targets.kvcore_target import KvcoreTarget

        return KvcoreTarget
    if spec == "vllm":
        from kvcheck.targets.vllm_target import VllmTarget, require_vllm

        try:
            require_vllm()
        except ImportError as exc:
            raise ValueError(f"target 'vllm': {exc}") from exc
        return VllmTarget
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"target {spec!r}: expected 'kvcore', 'vllm' or 'package.module:factory'")
    # A factory in the folder kvcheck runs from is found, as `python -m` would find it.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"target {spec!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        factory: TargetFactory = getattr(module, attr)
    except AttributeError as exc:
        raise ValueError(f"target {spec!r}: module {module_name!r} has no attribute {attr!r}") from exc
    return factory


BUILT_IN_ALLOCATORS = ("kvcore", "vllm")
"""Allocators whose free queue and block pool have targets of their own, for the component machines."""


def component_allocators(spec: str) -> list[str]:
    """The built-in allocators that ``spec`` names (``kvcore+vllm`` names both); a
    ``package.module:factory`` target has no free-queue or block-pool target."""
    return [part for part in spec.split("+") if part in BUILT_IN_ALLOCATORS]


def load_queue(allocator: str) -> Callable[[int], Any]:
    """The free-queue target factory of a built-in allocator (see :mod:`kvcheck.stateful_tests.free_queue_machine`)."""
    if allocator == "kvcore":
        from kvcheck.targets.kvcore_queue import KvcoreQueue

        return KvcoreQueue
    if allocator == "vllm":
        from kvcheck.targets.vllm_queue import VllmQueue

        return VllmQueue
    raise ValueError(f"allocator {allocator!r}: the free-queue machine drives {' or '.join(BUILT_IN_ALLOCATORS)}")


def load_pool(allocator: str) -> Callable[[int, bool], Any]:
    """The block-pool target factory of a built-in allocator (see :mod:`kvcheck.stateful_tests.block_pool_machine`)."""
    if allocator == "kvcore":
        from kvcheck.targets.kvcore_pool import KvcorePool

        return KvcorePool
    if allocator == "vllm":
        from kvcheck.targets.vllm_pool import VllmPool

        return VllmPool
    raise ValueError(f"allocator {allocator!r}: the block-pool machine drives {' or '.join(BUILT_IN_ALLOCATORS)}")
