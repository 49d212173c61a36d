"""The declaration of a configuration field: what it holds, its range, and the allocators that take it.

:class:`~kvmodel.config.TargetConfig` and :class:`~kvmodel.config.GroupSpec`
declare every field once, with :func:`declared`: its type and default as
attrs has them, and a :class:`Declaration` in the field's metadata.
Everything else is read from the declarations: the range check of
:meth:`~kvmodel.config.TargetConfig.validate`, the trace format (a field
without a default is required, one with a default is left out of a trace at
its default, in declaration order), and the keywords both targets pass to
their allocator's manager.  A new field therefore touches its declaration
and the code that uses its value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import attrs

Holds = Literal["integer", "flag", "fraction", "choice", "groups", "group_ids"]
"""What a field holds, which decides its check: an integer within a range, ``true`` or ``false``, a
fraction in [0, 1), one of a few names, the group specs, or group indices."""

ALLOCATORS = ("kvcore", "vllm")
"""The allocators whose managers take configuration fields by keyword."""

_METADATA_KEY = "kvcheck"


@attrs.frozen(kw_only=True)
class Declaration:
    """What a configuration field holds besides its type and default.

    ``minimum`` and ``maximum`` bound an integer (``minimum`` ``None``: each group kind sets its own
    floor) or, for ``groups`` and ``group_ids``, how many entries there may be; ``unit`` names what an
    integer counts in a refusal (``tokens``); ``spelled_as_range`` words the refusal "an integer from
    MINIMUM to MAXIMUM".  ``choices`` are the names a ``choice`` field takes.  ``allocators`` are those
    (of :data:`ALLOCATORS`) whose manager takes the field as a keyword of the same name.
    """

    holds: Holds
    minimum: int | None = 0
    maximum: int = 0
    unit: str = ""
    spelled_as_range: bool = False
    choices: tuple[str, ...] = ()
    allocators: tuple[str, ...] = ()


def declared(declaration: Declaration, *, default: Any = attrs.NOTHING, converter: Any = None) -> Any:
    """An attrs field carrying ``declaration`` (a field without ``default`` is required)."""
    return attrs.field(default=default, converter=converter, metadata={_METADATA_KEY: declaration})


def declarations(cls: type[Any]) -> Iterator[tuple[attrs.Attribute[Any], Declaration]]:
    """Every declared field of the attrs class ``cls``, in declaration order, with its declaration."""
    for attribute in attrs.fields(cls):
        declaration = attribute.metadata.get(_METADATA_KEY)
        if declaration is not None:
            yield attribute, declaration


def is_required(attribute: attrs.Attribute[Any]) -> bool:
    """Whether a trace must state the field: it has no default."""
    return attribute.default is attrs.NOTHING


def to_json(instance: Any) -> dict[str, Any]:
    """The declared fields of ``instance`` as a trace writes them: every required field, every other one
    unless it holds its default; tuples as lists, group specs as their own documents."""
    document: dict[str, Any] = {}
    for attribute, declaration in declarations(type(instance)):
        value = getattr(instance, attribute.name)
        if not is_required(attribute) and value == attribute.default:
            continue
        if declaration.holds == "groups":
            document[attribute.name] = [to_json(group) for group in value]
        elif isinstance(value, tuple):
            document[attribute.name] = list(value)
        else:
            document[attribute.name] = value
    return document


def allocator_keywords(instance: Any, allocator: str) -> dict[str, Any]:
    """The fields of ``instance`` that ``allocator``'s manager takes under their own names, by name."""
    return {
        attribute.name: getattr(instance, attribute.name)
        for attribute, declaration in declarations(type(instance))
        if allocator in declaration.allocators
    }
