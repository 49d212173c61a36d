"""What every benchmark script shares: where its figures came from, how they are written into
``docs/measurements/``, and how another source tree is measured beside this checkout.

A measured table is never typed by hand: a script prints it and, with ``--write PATH``, writes it with a
line saying which command wrote it, when, at which commit, on what machine.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def commit() -> str:
    """This checkout's commit, saying so when tracked files differ from it."""
    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty else "")


def provenance(script: str, argv: Sequence[str] | None = None) -> str:
    """One sentence: the command that wrote a table, the date, the commit and the machine.  An argument
    that is an absolute path is shown relative to the current folder: a committed report names no
    folder of the machine it ran on."""
    args = [os.path.relpath(arg) if os.path.isabs(arg) else arg for arg in (sys.argv[1:] if argv is None else argv)]
    command = " ".join(["python", f"benchmarks/{script}", *args])
    return (
        f"Written by `{command}` on {datetime.date.today().isoformat()}, at commit {commit()}, on "
        f"{platform.machine()} with {multiprocessing.cpu_count()} cores and Python {platform.python_version()}."
    )


def write_markdown(path: Path | str | None, text: str) -> None:
    """Print ``text``; with a path, also write it there (folders made as needed)."""
    print(text)
    if path is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text if text.endswith("\n") else text + "\n")


@contextlib.contextmanager
def checked_out(rev: str) -> Iterator[Path]:
    """``rev`` checked out into a temporary git worktree, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="kvcheck-rev-") as scratch:
        folder = Path(scratch) / "tree"
        git("worktree", "add", "--detach", str(folder), rev)
        try:
            yield folder
        finally:
            git("worktree", "remove", "--force", str(folder))


def tree_prelude(tree: Path) -> str:
    """Python source that makes a fresh interpreter import kvcheck, kvcore and kvmodel from ``tree``, and the
    folders the package maps into kvcheck (``stateful_tests``, ``regressions``; ``models`` in older trees)
    from that tree too, not from wherever kvcheck is installed."""
    return f"""
import importlib.util, sys
from pathlib import Path
sys.path.insert(0, {str(tree)!r})
import kvcheck
for folder in ("models", "stateful_tests", "regressions"):
    path = Path({str(tree)!r}) / folder
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            f"kvcheck.{{folder}}", path / "__init__.py", submodule_search_locations=[str(path)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"kvcheck.{{folder}}"] = module
        spec.loader.exec_module(module)
"""


def run_in_tree(tree: Path, body: str, python: str = sys.executable) -> str:
    """Run ``body`` in a fresh interpreter importing from ``tree``; its last line of output.  ``python``
    given as a path is taken from the current folder, not from ``tree`` (a venv's link is kept as is)."""
    if os.sep in python:
        python = os.path.abspath(python)
    done = subprocess.run(
        [python, "-c", tree_prelude(tree) + body], capture_output=True, text=True, cwd=tree, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"measuring {tree} failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


class _Tee:
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


@contextlib.contextmanager
def recorded_output(path: Path | str | None, title: str, script: str) -> Iterator[None]:
    """Everything printed inside goes to the terminal and, with a path, into a Markdown file there: the
    title, :func:`provenance`, and the printed report as a text block.  For scripts whose report is a text
    layout rather than a table."""
    if path is None:
        yield
        return
    captured = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, captured)):
        yield
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"# {title}\n\n{provenance(script)}\n\n```text\n{captured.getvalue().rstrip()}\n```\n")
