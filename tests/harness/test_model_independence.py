"""The reference model is an independent statement of the semantics, not a copy of kvcore."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_no_model_module_imports_kvcore() -> None:
    """No module under models/ names kvcore in an import statement."""
    offenders = []
    for path in sorted(MODELS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.name}: {name}" for name in names if name.split(".")[0] == "kvcore"]
    assert not offenders, f"models/ imports kvcore: {offenders}"


def test_importing_the_model_loads_no_kvcore_module() -> None:
    """Importing every model module, in a fresh interpreter, leaves kvcore unloaded."""
    code = (
        "import sys\n"
        "import kvcheck.models.manager_model, kvcheck.models.pool_model, kvcheck.models.invariants\n"
        "loaded = sorted(m for m in sys.modules if m == 'kvcore' or m.startswith('kvcore.'))\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=MODELS.parent, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"kvcore modules loaded by the model: {result.stdout.strip()}"
