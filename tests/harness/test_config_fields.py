"""A configuration field is declared once: the schema, the trace writer and reader, the range check and the
allocators' keywords all follow the declarations in kvmodel/config.py."""

from __future__ import annotations

import inspect
import json
from typing import Any

import attrs
import pytest

import kvcore
from kvcheck.targets.vllm_target import make_manager
from kvcheck.trace import SCHEMA_PATH, Trace, parse_trace
from kvmodel.config import TargetConfig
from kvmodel.config_checks import ConfigError
from kvmodel.fields import ALLOCATORS, Declaration, allocator_keywords, declarations, is_required
from kvmodel.group_spec import GroupSpec

SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
CONFIG_SCHEMA: dict[str, Any] = SCHEMA["properties"]["config"]
GROUP_SCHEMA: dict[str, Any] = CONFIG_SCHEMA["properties"]["groups"]["items"]
SCHEMAS = {TargetConfig: CONFIG_SCHEMA, GroupSpec: GROUP_SCHEMA}

DECLARED = [
    pytest.param(cls, attribute, declaration, id=f"{cls.__name__}.{attribute.name}")
    for cls in (TargetConfig, GroupSpec)
    for attribute, declaration in declarations(cls)
]
DECLARED_INTEGERS = [param for param in DECLARED if param.values[2].holds == "integer"]


@pytest.mark.parametrize("cls", [TargetConfig, GroupSpec])
def test_every_field_is_declared(cls: type[Any]) -> None:
    """No field of the configuration escapes the declarations (the trace format and checks read them)."""
    declared = [attribute.name for attribute, _ in declarations(cls)]
    assert declared == [attribute.name for attribute in attrs.fields(cls)]


@pytest.mark.parametrize("cls", [TargetConfig, GroupSpec])
def test_the_schema_names_the_declared_fields_and_requires_those_without_a_default(cls: type[Any]) -> None:
    schema = SCHEMAS[cls]
    attributes = [attribute for attribute, _ in declarations(cls)]
    assert set(schema["properties"]) == {attribute.name for attribute in attributes}
    assert set(schema["required"]) == {attribute.name for attribute in attributes if is_required(attribute)}


@pytest.mark.parametrize(("cls", "attribute", "declaration"), DECLARED)
def test_the_schema_bounds_are_the_declared_bounds(
    cls: type[Any], attribute: attrs.Attribute[Any], declaration: Declaration
) -> None:
    node = SCHEMAS[cls]["properties"][attribute.name]
    if declaration.holds == "integer":
        assert node["type"] == "integer"
        assert node["maximum"] == declaration.maximum
        if declaration.minimum is not None:
            assert node["minimum"] == declaration.minimum
    elif declaration.holds in ("groups", "group_ids"):
        assert node["maxItems"] == declaration.maximum
    elif declaration.holds == "flag":
        assert node["type"] == "boolean"
    elif declaration.holds == "choice":
        assert node["enum"] == list(declaration.choices)
    else:
        assert node == {**node, "type": "number", "minimum": 0, "exclusiveMaximum": 1}


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_the_keywords_passed_to_an_allocator_are_its_managers(allocator: str) -> None:
    """Every field declared for an allocator is a keyword its manager (or its configuration) takes."""
    config = TargetConfig(num_blocks=8, block_size=2, groups=(GroupSpec(kind="full"),), enable_caching=True)
    if allocator == "kvcore":
        accepted = {attribute.name for attribute in attrs.fields(kvcore.KVCacheConfig)}
    else:
        accepted = set(inspect.signature(make_manager).parameters)
    keywords = allocator_keywords(config, allocator)
    assert keywords, allocator
    assert set(keywords) <= accepted, set(keywords) - accepted


OTHER_VALUES: dict[str, Any] = {
    "use_eagle": True,
    "num_lookahead_tokens": 2,
    "eagle_group_ids": (0,),
    "num_hash_lookahead_tokens": 1,
    "num_prefill_lookahead": 1,
    "reserve_full_sequence": True,
    "max_in_flight_tokens": 4,
    "reserved_blocks": 1,
    "watermark": 0.25,
    "async_scheduling": True,
    "defer_block_free": True,
    "enable_kv_cache_events": True,
    "hash_block_size": 1,
    "dcp_world_size": 2,
    "enable_mamba_shared_prefix_checkpoint": True,
}
"""A value other than its default of each optional field, valid in the configuration below."""


@pytest.mark.parametrize("name", sorted(OTHER_VALUES))
def test_a_field_off_its_default_is_written_and_read_back_and_left_out_at_its_default(name: str) -> None:
    groups = (GroupSpec(kind="full"), GroupSpec(kind="full"))
    base = TargetConfig(num_blocks=8, block_size=2, groups=groups, enable_caching=True)
    changes = {name: OTHER_VALUES[name]}
    if name == "defer_block_free":
        changes["async_scheduling"] = True
    config = attrs.evolve(base, **changes).validate()
    document = json.loads(Trace(config, ()).dumps())["config"]
    assert name in document
    assert parse_trace(Trace(config, ()).dumps()).config == config
    assert name not in json.loads(Trace(base, ()).dumps())["config"]


@pytest.mark.parametrize(("cls", "attribute", "declaration"), DECLARED_INTEGERS)
def test_a_value_above_its_declared_maximum_is_refused_by_name(
    cls: type[Any], attribute: attrs.Attribute[Any], declaration: Declaration
) -> None:
    group = GroupSpec(kind="sliding_window", window=4)
    config = TargetConfig(num_blocks=8, block_size=2, groups=(group,), enable_caching=False)
    if cls is GroupSpec:
        config = attrs.evolve(config, groups=(attrs.evolve(group, **{attribute.name: declaration.maximum + 1}),))
        field = f"groups[0].{attribute.name}"
    else:
        config = attrs.evolve(config, **{attribute.name: declaration.maximum + 1})
        field = attribute.name
    with pytest.raises(ConfigError) as raised:
        config.validate()
    assert raised.value.field == field
    assert str(declaration.maximum) in raised.value.detail
