"""What every kvcheck command shares: exit codes, the suite's folders, refusals of bad input, loading traces."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvmodel.limits import (
    above,
)

if TYPE_CHECKING:
    from kvcheck.trace import Trace

EXIT_OK, EXIT_VIOLATION, EXIT_BAD_INPUT = 0, 1, 2

TARGET_HELP = (
    "allocator to drive: 'kvcore' (default), 'vllm', 'package.module:factory', "
    "or several of those joined by '+' (e.g. 'kvcore+vllm'), compared step by step"
)


def suite_folder(package: str) -> Path:
    """The folder of one of the suite's packages (``kvcheck.stateful_tests``, ``kvcheck.regressions``):
    in a checkout, the repository's top-level folder; installed, the one inside the kvcheck package."""
    import importlib

    module = importlib.import_module(package)
    assert module.__file__ is not None
    return Path(module.__file__).parent


def default_corpus() -> Path:
    """The regression corpus kvcheck ships (``regressions/traces`` in a checkout)."""
    return suite_folder("kvcheck.regressions") / "traces"


def bad_input(message: str) -> int:
    print(f"kvcheck: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def out_of_range(options: Sequence[tuple[str, int | None, int, int]]) -> str | None:
    """The refusal of the first (option, value, minimum, maximum) whose value is out of range, if any."""
    for option, value, minimum, maximum in options:
        if value is None:
            continue
        if value < minimum:
            return f"{option}: {value} is below the minimum of {minimum}"
        if value > maximum:
            return f"{option}: {above(value, maximum)}"
    return None


def load_traces(paths: Sequence[str]) -> list[tuple[str, Trace]] | int:
    from kvcheck.trace import TraceError, load_trace

    traces = []
    for path in paths:
        try:
            traces.append((path, load_trace(path)))
        except TraceError as exc:
            return bad_input(str(exc))
    return traces
