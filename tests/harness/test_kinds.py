"""The group kinds are declared once, in kvmodel/kinds/, and the model asks them, not their names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvmodel.config_checks import ConfigError
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import GROUP_KINDS, KINDS, kind_named

MODEL = Path(__file__).resolve().parents[2] / "kvmodel"


def test_every_kind_is_registered_once_under_its_name() -> None:
    assert tuple(KINDS) == GROUP_KINDS
    assert len(set(GROUP_KINDS)) == len(GROUP_KINDS)
    for name, kind in KINDS.items():
        assert kind.name == name
        assert kind_named(name) is kind


def test_kind_names_are_literals_only_in_the_kind_modules() -> None:
    """No model module outside kvmodel/kinds/ holds a kind's name as a string constant: it asks the kind."""
    offenders = []
    for path in sorted(MODEL.rglob("*.py")):
        if path.parent.name == "kinds":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and node.value in KINDS:
                offenders.append(f"{path.relative_to(MODEL)}:{node.lineno}: {node.value!r}")
    assert not offenders, f"kind names compared outside kvmodel/kinds/: {offenders}"


@pytest.mark.parametrize(
    ("kind", "window", "detail"),
    [
        ("sliding_window", 1, "a sliding window needs at least 2 tokens, got 1"),
        ("rswa", 0, "an R-SWA window needs at least 1 token, got 0"),
        ("chunked_local", 6, "an attention chunk must be a positive multiple of block_size=4, got 6"),
        ("full", 4, "a full group has no window, got 4"),
    ],
)
def test_each_kind_validates_its_window(kind: str, window: int, detail: str) -> None:
    with pytest.raises(ConfigError) as raised:
        GroupSpec(kind=kind, window=window).validate(4, "groups[0]")
    assert raised.value.field == "groups[0].window"
    assert raised.value.detail == detail


def test_messages_name_the_kinds_with_the_trait() -> None:
    with pytest.raises(ConfigError, match="only a mamba or mamba_align group has speculative blocks"):
        GroupSpec(kind="full", speculative_blocks=1).validate(4, "groups[0]")
    with pytest.raises(ConfigError, match="only a mamba_align group has prefill checkpoints"):
        GroupSpec(kind="mamba", prefill_checkpoint_alignment=2).validate(4, "groups[0]")
