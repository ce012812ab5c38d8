"""The set-up's byte-compiling (tools/bytecode.py): importing writes each module's .pyc even where
PYTHONDONTWRITEBYTECODE is set, and a module that fails to import is reported, not fatal."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_importing_writes_the_bytecode_and_reports_what_failed(tmp_path):
    (tmp_path / "fine").mkdir()
    (tmp_path / "fine" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "fine" / "part.py").write_text("from . import VALUE\n")
    (tmp_path / "broken.py").write_text("raise SystemExit('no')\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    code = "import json; from tools.bytecode import import_all; print(json.dumps(import_all(['fine', 'fine.part', 'broken', 'missing'])))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    failed = json.loads(proc.stdout)
    assert [f.split(":")[0] for f in failed] == ["broken", "missing"]
    assert "SystemExit: no" in failed[0] and "ModuleNotFoundError" in failed[1]
    written = sorted(p.name.split(".")[0] for p in (tmp_path / "fine" / "__pycache__").glob("*.pyc"))
    assert written == ["__init__", "part"]
