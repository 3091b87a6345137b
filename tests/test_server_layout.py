"""The runtime stands on its own: the server loads neither the DSL nor the CLI, and no runtime
module imports the public face (`import radixflow`, `from radixflow import ...`)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import radixflow.runtime

RUNTIME_DIR = Path(radixflow.runtime.__file__).parent

# The root package's __init__ loads the DSL, so the probe registers the root package without
# running it: what is loaded then is what the runtime itself imports.
_PROBE = """
import importlib, importlib.util, json, pkgutil, sys
spec = importlib.util.find_spec("radixflow")
sys.modules["radixflow"] = importlib.util.module_from_spec(spec)
import radixflow.runtime.server as server
for info in pkgutil.iter_modules(server.__path__):
    importlib.import_module(f"radixflow.runtime.server.{info.name}")
print(json.dumps(sorted(m for m in sys.modules if m.startswith("radixflow"))))
"""


def test_the_server_loads_neither_the_dsl_nor_the_cli():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert "radixflow.runtime.server.app" in loaded  # the probe did import the server
    assert "radixflow.runtime.server.launch" in loaded
    assert [m for m in loaded if m.startswith("radixflow.frontend")] == []
    assert "radixflow.runtime.cli" not in loaded


def _public_face_imports(path: Path) -> list[str]:
    """`import radixflow` / `from radixflow import x` statements in a file, as `file:line`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            hit = any(alias.name == "radixflow" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            hit = node.module == "radixflow" and node.level == 0
        else:
            continue
        if hit:
            found.append(f"{path.relative_to(RUNTIME_DIR)}:{node.lineno}")
    return found


def test_no_runtime_module_imports_the_public_face():
    files = sorted(RUNTIME_DIR.rglob("*.py"))
    assert RUNTIME_DIR / "server" / "app.py" in files
    assert [hit for f in files for hit in _public_face_imports(f)] == []


def test_the_public_face_check_sees_both_forms(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "RUNTIME_DIR", tmp_path)
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import radixflow\n"
        "from radixflow import Engine\n"
        "import radixflow.runtime.engine\n"
        "from radixflow.runtime import cli\n"
        "def f():\n"
        "    import radixflow as rf\n"
    )
    assert _public_face_imports(sample) == ["sample.py:1", "sample.py:2", "sample.py:6"]
