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
