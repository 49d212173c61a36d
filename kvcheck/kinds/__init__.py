"""The group kinds as the harness uses them, one module per family of kinds of the reference model.

Each kind of :data:`kvmodel.kinds.KINDS` is declared in the module of this package named as the model's
module that declares it (``kvmodel.kinds.mamba``: ``kvcheck.kinds.mamba``), in that module's ``KINDS``; the
registry is built from the model's, in its order, so a new kind needs only its own module here.
"""

from __future__ import annotations

import importlib
from typing import cast

from kvcheck.kinds.base import HarnessKind
from kvmodel.kinds import KINDS as MODEL_KINDS
from kvmodel.kinds import Kind


def _declaration(model: Kind) -> HarnessKind:
    """The harness kind of the model's kind ``model``, from the module named as the model's."""
    family = type(model).__module__.rpartition(".")[2]
    module = importlib.import_module(f"{__name__}.{family}")
    declared = {kind.name: kind for kind in cast(tuple[HarnessKind, ...], module.KINDS)}
    if model.name not in declared:
        raise LookupError(f"{module.__name__} declares no harness kind {model.name!r}")
    return declared[model.name]


KINDS: dict[str, HarnessKind] = {name: _declaration(model) for name, model in MODEL_KINDS.items()}
"""Every group kind by name, in the model's order."""


def kind_of(name: str) -> HarnessKind:
    """The harness kind called ``name``."""
    return KINDS[name]


MIXED_DRAWS = tuple(kind for kind in KINDS.values() for _ in range(kind.mixed_weight))
"""The kinds a mixed layout draws each group from, each named as often as it is weighted."""
BESIDE_STATES_DRAWS = tuple(kind for kind in KINDS.values() for _ in range(kind.beside_states_weight))
"""The local-attention kinds drawn beside Mamba states, each named as often as it is weighted."""

__all__ = ["BESIDE_STATES_DRAWS", "KINDS", "MIXED_DRAWS", "HarnessKind", "kind_of"]
