"""The reference model is an independent statement of the semantics, not a copy of kvcore."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "kvmodel"


def test_no_model_module_imports_kvcore_or_kvcheck() -> None:
    """No module under kvmodel/ names kvcore or kvcheck in an import statement: the model is a bottom
    layer beside kvcore, not built on what it checks or on what drives it."""
    offenders = []
    for path in sorted(MODELS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            offenders += [
                f"{path.relative_to(MODELS)}: {name}" for name in names if name.split(".")[0] in ("kvcore", "kvcheck")
            ]
    assert not offenders, f"kvmodel/ imports kvcore or kvcheck: {offenders}"


def test_importing_the_model_loads_no_kvcore_or_kvcheck_module() -> None:
    """Importing every model module, in a fresh interpreter, leaves kvcore and kvcheck unloaded."""
    code = (
        "import sys\n"
        "import kvmodel.manager_model, kvmodel.pool_model, kvmodel.invariants\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('kvcore', 'kvcheck'))\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=MODELS.parent, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"kvcore or kvcheck modules loaded by the model: {result.stdout.strip()}"


VOCABULARY = frozenset(
    {
        "kvmodel.config",
        "kvmodel.config_checks",
        "kvmodel.config_rules",
        "kvmodel.fields",
        "kvmodel.group_spec",
        "kvmodel.limits",
        "kvmodel.observation",
        "kvmodel.ops",
        "kvmodel.semantics",
        "kvmodel.step_plans",
    }
)
"""The model modules a target may import: the vocabulary the lockstep speaks to both sides (the
operations and the steps they ask for, the configuration and its field declarations, observations, release semantics and
input limits).  Nothing else of the model runs inside a target, so a bug in the model's statement of
a behaviour (steps in flight, the prefix lookup, allocation ...) is never also the target's."""

RAISED_BY_TARGETS = frozenset({("kvmodel.invariants", "InvariantViolation")})
"""Names a target may take from elsewhere in the model: the differential target raises the invariants'
failure when two targets disagree."""


def _model_imports(path: Path) -> list[tuple[str, str]]:
    """(kvmodel module, name) for every name ``path`` imports from the model (name ``*`` for a whole module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "*") for alias in node.names if alias.name.split(".")[0] == "kvmodel"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kvmodel":
            for alias in node.names:
                if node.module == "kvmodel":
                    found.append((f"kvmodel.{alias.name}", "*"))
                else:
                    found.append((node.module or "", alias.name))
    return found


def test_targets_import_only_the_model_vocabulary() -> None:
    """kvcore and the targets (kvcheck/targets/) import no model module beyond the vocabulary: the model
    shares no code with what it checks."""
    root = MODELS.parent
    offenders = []
    for path in sorted([*(root / "kvcore").rglob("*.py"), *(root / "kvcheck" / "targets").rglob("*.py")]):
        for module, name in _model_imports(path):
            if module not in VOCABULARY and (module, name) not in RAISED_BY_TARGETS:
                offenders.append(f"{path.relative_to(root)}: {module}.{name}")
    assert not offenders, f"a target imports model code it would then share with the model: {offenders}"


def test_the_vocabulary_rule_reads_imports() -> None:
    """The reader finds the scheduler's imports of the vocabulary, so the rule above cannot pass on nothing."""
    scheduler = MODELS.parent / "kvcheck" / "targets" / "scheduler.py"
    assert ("kvmodel.ops", "StepResult") in _model_imports(scheduler)
