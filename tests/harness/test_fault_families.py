"""The fault catalogues are built from the family modules of ``kvcheck.faults``: every declared fault
is listed once, in the order its number gives, and a fault expressed against vLLM is a kvcore fault
too."""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter
from pathlib import Path

import kvcheck.faults
from kvcheck.faults import DECLARED, FAMILIES, FAULTS, VLLM_FAULTS
from kvcheck.trace import load_trace


def test_every_module_declaring_faults_is_a_family_of_the_catalogue() -> None:
    """A module of the package with a ``FAMILY`` is one of ``FAMILIES``, so none of its faults is left out."""
    declaring = {
        module.name
        for module in pkgutil.iter_modules(kvcheck.faults.__path__, prefix="kvcheck.faults.")
        if hasattr(importlib.import_module(module.name), "FAMILY")
    }
    assert declaring == {family.__name__ for family in FAMILIES}


def test_every_fault_is_declared_once() -> None:
    """No two declarations, in one family or in two, share a name."""
    repeated = sorted(name for name, count in Counter(fault.name for fault in DECLARED).items() if count > 1)
    assert not repeated, f"faults declared more than once: {repeated}"


def test_the_kvcore_catalogue_lists_every_declared_fault_by_its_number() -> None:
    """``FAULTS`` holds every declaration, in the order of their numbers, which run from 1 without a gap."""
    numbers = sorted(fault.number for fault in DECLARED)
    assert numbers == list(range(1, len(DECLARED) + 1))
    by_number = sorted(DECLARED, key=lambda fault: fault.number)
    assert list(FAULTS) == [fault.name for fault in by_number]
    assert all(FAULTS[fault.name].plant is fault.kvcore for fault in DECLARED)


def test_the_vllm_catalogue_lists_every_vllm_plant_by_its_number() -> None:
    """``VLLM_FAULTS`` holds every declared vLLM plant, in the order of their numbers, which run from 1
    without a gap."""
    plants = {fault.name: fault.vllm for fault in DECLARED if fault.vllm is not None}
    assert sorted(plant.number for plant in plants.values()) == list(range(1, len(plants) + 1))
    assert list(VLLM_FAULTS) == sorted(plants, key=lambda name: plants[name].number)
    for name, plant in plants.items():
        assert VLLM_FAULTS[name].plant is plant.plant
        assert VLLM_FAULTS[name].description == plant.description


def test_every_vllm_fault_is_a_kvcore_fault_of_the_same_name() -> None:
    assert VLLM_FAULTS.keys() <= FAULTS.keys()


def test_a_fault_hunted_in_a_layout_of_its_own_shows_there_in_the_corpus() -> None:
    """A fault declared to be hunted in the Mamba layouts has a corpus trace with a Mamba group, and
    one hunted beside local attention a trace with a window beside the states: the layout
    ``bench_detection.py`` runs it in can make the configuration it needs."""
    corpus = Path(__file__).resolve().parents[2] / "regressions" / "traces"
    shown: dict[str, list[set[str]]] = {}
    for path in sorted(corpus.glob("*.json")):
        trace = load_trace(path)
        if trace.expect is not None and trace.expect.fault is not None:
            rules = [group.rules for group in trace.config.groups]
            traits = {"mamba"} if any(r.holds_state for r in rules) else set()
            if traits and any(r.has_window for r in rules):
                traits.add("samba")
            shown.setdefault(trace.expect.fault, []).append(traits)
    hunted = {fault.name: fault.layout for fault in DECLARED if isinstance(fault.layout, str)}
    assert hunted, "no fault declares a layout of its own"
    wrong = sorted(name for name, layout in hunted.items() if not any(layout in t for t in shown.get(name, [])))
    assert not wrong, f"hunted in a layout their corpus traces do not have: {wrong}"
