"""Typed errors raised by kvcore.

Every error derives from :class:`KVCoreError` and carries the data that
explains it as fields, so callers can react to the value rather than parse a
message.  An operation that raises leaves the allocator exactly as it was.
"""

from __future__ import annotations

import attrs


@attrs.define(auto_exc=True, str=False)
class KVCoreError(Exception):
    """The root of every error kvcore raises."""

    def __str__(self) -> str:
        return self.describe()

    def describe(self) -> str:
        fields = ", ".join(f"{a.name}={getattr(self, a.name)!r}" for a in attrs.fields(type(self)))
        return f"{type(self).__name__}({fields})"


@attrs.define(auto_exc=True, str=False)
class InvalidConfig(KVCoreError):
    """A configuration value is out of its allowed range."""

    field: str
    value: object
    reason: str

    def describe(self) -> str:
        return f"invalid config: {self.field}={self.value!r}: {self.reason}"


@attrs.define(auto_exc=True, str=False)
class InvalidArgument(KVCoreError):
    """An argument of an allocator call is out of its allowed range."""

    name: str
    value: object
    reason: str

    def describe(self) -> str:
        return f"invalid argument: {self.name}={self.value!r}: {self.reason}"


@attrs.define(auto_exc=True, str=False)
class OutOfBlocks(KVCoreError):
    """An allocation asked for more blocks than are free."""

    requested: int
    available: int

    def describe(self) -> str:
        return f"out of blocks: requested {self.requested}, {self.available} free"


@attrs.define(auto_exc=True, str=False)
class UnknownBlock(KVCoreError):
    """A block id names no block of the pool."""

    block_id: object
    num_blocks: int

    def describe(self) -> str:
        return f"unknown block id {self.block_id!r}: the pool has ids 0..{self.num_blocks - 1}"


@attrs.define(auto_exc=True, str=False)
class RefCountUnderflow(KVCoreError):
    """A block was freed more times than it was held."""

    block_id: int

    def describe(self) -> str:
        return f"block {self.block_id} freed while its ref_cnt is already 0"


@attrs.define(auto_exc=True, str=False)
class RequestTooLong(KVCoreError):
    """A request needs more token slots than the model length allows."""

    request_id: str
    num_tokens: int
    max_model_len: int

    def describe(self) -> str:
        return (
            f"request {self.request_id!r} needs {self.num_tokens} token slots, "
            f"more than max_model_len={self.max_model_len}"
        )
