"""The harness declares each group kind once, in kvcheck/kinds/, beside the model's declaration in
kvmodel/kinds/; the rest of kvcheck and the machines name a kind by its object or ask its traits."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import kvcheck.kinds
from kvcheck.kinds import BESIDE_STATES_DRAWS, KINDS, MIXED_DRAWS, HarnessKind, kind_of
from kvmodel.kinds import KINDS as MODEL_KINDS

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (ROOT / "kvcheck", ROOT / "stateful_tests")
DECLARATIONS = ROOT / "kvcheck" / "kinds"


def _harness_modules() -> list[str]:
    return [info.name for info in pkgutil.iter_modules(kvcheck.kinds.__path__) if info.name != "base"]


def test_every_model_kind_has_one_harness_declaration_and_no_other_is_declared() -> None:
    declared: dict[str, HarnessKind] = {}
    for module_name in _harness_modules():
        module = importlib.import_module(f"kvcheck.kinds.{module_name}")
        for kind in module.KINDS:
            assert kind.name not in declared, f"{kind.name} is declared twice"
            declared[kind.name] = kind
            model = MODEL_KINDS.get(kind.name)
            assert model is not None, f"kvcheck.kinds.{module_name} declares {kind.name}, which the model has not"
            assert kind.model is model
            assert type(model).__module__ == f"kvmodel.kinds.{module_name}"
    assert set(declared) == set(MODEL_KINDS)
    assert tuple(KINDS) == tuple(MODEL_KINDS)
    for name, kind in KINDS.items():
        assert kind is declared[name]
        assert kind_of(name) is kind


def test_the_draw_lists_keep_their_order_and_weights() -> None:
    # The search's random draws index these lists: their order and repetition are the draws.
    assert [kind.name for kind in MIXED_DRAWS] == ["full", "mla", "sliding_window", "chunked_local", "rswa", "ring"]
    assert [kind.name for kind in BESIDE_STATES_DRAWS] == ["sliding_window", "chunked_local", "rswa", "rswa"]


def _is_kind_field(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "kind") or (
        isinstance(node, ast.Name) and node.id == "kind"
    )


def _is_kind_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODEL_KINDS


def _names_a_kind(node: ast.expr) -> bool:
    """A kind name, or a tuple, list or set holding one."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_kind_name(element) for element in node.elts)
    return _is_kind_name(node)


def kind_name_literals(source: str) -> list[tuple[int, str]]:
    """Where ``source`` names a group kind by a string: compares a ``kind`` with one (or a collection
    holding one), passes one as ``kind=``, or holds a kind map (a dict keyed by kind names, a tuple, list
    or set of kind names only)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind_field(side) for side in sides) and any(_names_a_kind(side) for side in sides):
                found.append((node.lineno, "compared with a kind"))
        elif isinstance(node, ast.keyword) and node.arg == "kind" and _is_kind_name(node.value):
            found.append((node.value.lineno, "given as kind="))
        elif (
            isinstance(node, ast.Dict)
            and node.keys
            and all(key is not None and _is_kind_name(key) for key in node.keys)
        ):
            found.append((node.lineno, "keys of a kind map"))
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts and all(map(_is_kind_name, node.elts)):
            found.append((node.lineno, "a list of kinds"))
    return found


@pytest.mark.parametrize(
    "source",
    [
        'group.kind == "ring"',
        'kind != "mamba"',
        'group.kind in ("mamba", "mamba_align")',
        'GroupSpec(kind="full")',
        'attrs.evolve(group, kind="mamba_align")',
        '{"chunked_local": 4, "rswa": 1}.get(group.kind, 2)',
        'rng.choice(["full", "mla", "ring"])',
        'LAYOUTS = {"window": ("sliding_window",)}',
    ],
)
def test_the_check_finds_a_kind_named_by_a_string(source: str) -> None:
    assert kind_name_literals(source)


@pytest.mark.parametrize(
    "source",
    [
        'layout == "mamba"',
        'layout in ("mixed", "mamba", "rswa")',
        'LAYOUTS = {"full": (FULL,), "full+window": (FULL, SLIDING_WINDOW)}',
        "group.kind == FULL.name",
        'GroupSpec(kind=ALIGN.name, window="ring")',
    ],
)
def test_the_check_leaves_layout_names_and_kind_objects(source: str) -> None:
    assert not kind_name_literals(source)


def test_no_module_outside_the_kind_declarations_names_a_kind_by_a_string() -> None:
    offenders = []
    for top in SCANNED:
        for path in sorted(top.rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if path.is_relative_to(DECLARATIONS):
                continue
            offenders += [f"{relative}:{line}: {what}" for line, what in kind_name_literals(path.read_text())]
    assert not offenders, f"kinds named by a string outside kvcheck/kinds/: {offenders}"
