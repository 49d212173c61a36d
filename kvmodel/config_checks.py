"""The range checks of declared configuration fields, and the error a configuration out of range raises."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeGuard

from kvmodel.fields import Declaration, declarations
from kvmodel.limits import above, shown


def int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    """The converter of fields holding block ids, group ids or tokens."""
    return tuple(values)


class ConfigError(ValueError):
    """A target configuration field is out of range: ``field`` names it, ``detail`` says what is wrong
    (naming the value, and the limit when it is above one)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an integer (JSON ``true`` and ``false`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_declared(instance: Any, where: str = "") -> None:
    """Refuse the first declared field of ``instance`` outside what its declaration allows, naming it
    after ``where``; a field at its default of ``None`` (absent) passes."""
    for attribute, declaration in declarations(type(instance)):
        value = getattr(instance, attribute.name)
        if value is None and attribute.default is None:
            continue
        _check_value(where + attribute.name, value, declaration)


def _check_value(name: str, value: Any, declaration: Declaration) -> None:
    holds, minimum, maximum, unit = declaration.holds, declaration.minimum, declaration.maximum, declaration.unit
    if holds == "flag":
        if not isinstance(value, bool):
            raise ConfigError(name, f"must be true or false, got {shown(value)}")
    elif holds == "fraction":
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(name, f"must be a fraction of the pool, got {shown(value)}")
        if not 0 <= value < 1:
            raise ConfigError(name, f"must be >= 0 and < 1, got {shown(value)}")
    elif holds == "choice":
        if not isinstance(value, str) or value not in declaration.choices:
            raise ConfigError(name, f"must be one of {', '.join(declaration.choices)}, got {shown(value)}")
    elif holds == "groups":
        if not value:
            raise ConfigError(name, "at least one group is needed")
        if len(value) > maximum:
            raise ConfigError(name, above(len(value), maximum, "groups"))
    elif holds == "group_ids":
        if not isinstance(value, tuple):
            raise ConfigError(name, f"must be a list of group indices, got {shown(value)}")
    elif declaration.spelled_as_range:
        if not is_int(value) or not (minimum or 0) <= value <= maximum:
            counted = f" {unit}" if unit else ""
            raise ConfigError(name, f"must be an integer from {minimum} to {maximum}{counted}, got {shown(value)}")
    else:
        if minimum is None:
            if not is_int(value):
                raise ConfigError(name, f"must be an integer number of {unit}, got {shown(value)}")
        elif not is_int(value) or value < minimum:
            raise ConfigError(name, f"must be an integer >= {minimum}, got {shown(value)}")
        if value > maximum:
            raise ConfigError(name, above(value, maximum, unit))
