"""The verdicts of one or several source trees side by side: the kill matrix (which invariant kills each
catalogued fault, after how many runs, shrunk to how many steps) and the corpus (each trace clean on the
target, and under its tagged fault the invariant it names).  A restructuring of kvcheck must leave every
row alike; this script shows it.

    python benchmarks/bench_verdicts.py                                  # this checkout
    python benchmarks/bench_verdicts.py --rev d770bd1                    # a commit against this checkout
    python benchmarks/bench_verdicts.py --rev d770bd1 --target vllm --python .venv-vllm/bin/python
    python benchmarks/bench_verdicts.py --rev d770bd1 --write docs/measurements/verdicts-kvcore.md
    python benchmarks/bench_verdicts.py --rev a71500e --keep .verdicts   # measure a71500e once, reuse it

The kill matrix runs at its default budget (fixed seeds, counted in runs), so its verdicts do not depend
on the machine.  Each tree runs in a fresh interpreter that imports kvcheck, and the folders the package
maps into it, from that tree; a revision is checked out into a temporary git worktree, removed
afterwards.  ``--target vllm`` needs a Python whose environment has vLLM installed.  Exits 1 when the
trees disagree.  With ``--keep FOLDER``, a revision's verdicts are kept there under its full commit
and target, and read back instead of measured again: a commit's verdicts at fixed seeds never change,
so only this checkout is measured on the second run.  Run from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from measurement import checked_out, commit, git, provenance, run_in_tree, write_markdown

MEASURE = """
import json
from kvcheck.kill_matrix import kill_matrix
from kvcheck.replay import replay, resolve_target
from kvcheck.trace import load_trace

kills = {
    r.fault: [r.invariant or "NOT KILLED", r.runs_to_first_failure, r.shrunk_steps]
    for r in kill_matrix(target=TARGET)
}
# On vLLM, a corpus trace's fault is planted only when it is also expressed against vLLM.
planted = set(kills) if TARGET == "vllm" else None
corpus = {}
for path in sorted((TREE / "regressions" / "traces").glob("*.json")):
    trace = load_trace(path)
    clean = replay(trace, resolve_target(TARGET)).violation
    row = [clean.invariant if clean else "clean"]
    fault = trace.expect.fault if trace.expect else None
    if fault is not None and (planted is None or fault in planted):
        found = replay(trace, resolve_target(TARGET, fault)).violation
        row.append(f"{fault}: {found.invariant if found else 'clean'}")
    else:
        row.append("-")
    corpus[path.stem] = row
print(json.dumps({"kills": kills, "corpus": corpus}))
"""

Verdicts = dict[str, dict[str, list[object]]]


def measure(tree: Path, target: str, python: str) -> Verdicts:
    setting = f"TARGET = {target!r}\nTREE = Path({str(tree)!r})\n"
    result: Verdicts = json.loads(run_in_tree(tree, setting + MEASURE, python))
    return result


def measure_revision(rev: str, target: str, python: str, keep: str | None, stack: contextlib.ExitStack) -> Verdicts:
    """The verdicts of revision ``rev``: read from ``keep`` when measured before, else measured in a
    temporary worktree (and kept)."""
    kept = Path(keep) / f"{git('rev-parse', rev + '^{commit}')}-{target}.json" if keep else None
    if kept is not None and kept.is_file():
        print(f"reading {rev} from {kept} ...", file=sys.stderr, flush=True)
        result: Verdicts = json.loads(kept.read_text())
        return result
    print(f"measuring {rev} ...", file=sys.stderr, flush=True)
    result = measure(stack.enter_context(checked_out(rev)), target, python)
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(result))
    return result


def side_by_side(
    title: str, labels: list[str], names: list[str], columns: list[dict[str, list[object]]]
) -> tuple[list[str], int]:
    lines = [f"| {title} | " + " | ".join(labels) + " | alike |", "|---" * (len(labels) + 2) + "|"]
    differing = 0
    for name in names:
        cells = [" · ".join(str(v) for v in column.get(name, ["absent"])) for column in columns]
        alike = len(set(cells)) == 1
        differing += not alike
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if alike else '**no**'} |")
    return lines, differing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", action="append", default=[], help="a git revision to compare (repeatable)")
    parser.add_argument("--target", choices=("kvcore", "vllm"), default="kvcore")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run each tree with")
    parser.add_argument("--write", help="also write the tables to this markdown file")
    parser.add_argument("--keep", help="a folder that keeps each revision's verdicts, to read instead of remeasure")
    parser.add_argument("--only-revisions", action="store_true", help="measure (and keep) the revisions only")
    args = parser.parse_args()

    labels: list[str] = []
    results: list[Verdicts] = []
    with contextlib.ExitStack() as stack:
        for rev in args.rev:
            labels.append(rev)
            results.append(measure_revision(rev, args.target, args.python, args.keep, stack))
        if args.only_revisions:
            return 0
        print("measuring this checkout ...", file=sys.stderr, flush=True)
        labels.append(f"this checkout ({commit()})")
        results.append(measure(Path(__file__).resolve().parents[1], args.target, args.python))

    kill_names = list(dict.fromkeys(name for result in results for name in result["kills"]))
    trace_names = sorted({name for result in results for name in result["corpus"]})
    kills, kills_differing = side_by_side(
        "fault (killed by · runs · shrunk steps)", labels, kill_names, [r["kills"] for r in results]
    )
    corpus, corpus_differing = side_by_side(
        "corpus trace (on the target · under its fault)", labels, trace_names, [r["corpus"] for r in results]
    )
    header = [
        f"# Verdicts on {args.target}, side by side",
        "",
        provenance("bench_verdicts.py"),
        "",
        f"{len(kill_names) - kills_differing} of {len(kill_names)} faults and "
        f"{len(trace_names) - corpus_differing} of {len(trace_names)} corpus traces alike.",
        "",
    ]
    write_markdown(args.write, "\n".join([*header, *kills, "", *corpus, ""]))
    return 1 if kills_differing or corpus_differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
