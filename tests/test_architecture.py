"""The import rules of STYLE.md, enforced by import-linter (contracts in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_importing_the_package_does_not_import_torch():
    code = "import spinf, spinf.protocol, spinf.settings, spinf.errors, sys; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_looking_up_the_tiny_model_does_not_import_torch_or_the_engine(tmp_path):
    """The catalog only says where the missing snapshot goes; generating it (torch) is the engine's."""
    code = (
        "import sys; from spinf.catalog import TinySnapshotMissing, find_checkpoint, resolve_model\n"
        "try:\n"
        f"    find_checkpoint(resolve_model('tiny'), cache_dirs=[{str(tmp_path)!r}], hf_home={str(tmp_path)!r})\n"
        "except TinySnapshotMissing as missing:\n"
        "    print(missing.root, sorted(m for m in sys.modules if m == 'torch' or m.startswith('spinf.engine')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == f"{tmp_path} []"
