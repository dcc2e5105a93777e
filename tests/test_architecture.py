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


def _import_circles(package: str) -> list[list[str]]:
    """The strongly connected parts (more than one module) of ``package``'s import graph, every import counted
    (those inside functions too; those under TYPE_CHECKING not)."""
    import grimp

    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    edges = {
        m: [n for n in graph.find_modules_directly_imported_by(m) if n.startswith(package)] for m in graph.modules
    }
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm; the graph is a few hundred modules deep at most
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in edges[module]:
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            part = []
            while not part or part[-1] != module:
                part.append(stack.pop())
            if len(part) > 1:
                circles.append(sorted(part))

    for module in sorted(edges):
        if module not in order:
            visit(module)
    return circles


def test_no_import_circle_inside_spinf():
    assert _import_circles("spinf") == []


def test_a_circle_through_a_function_level_import_is_found(tmp_path, monkeypatch):
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circled import b\n")
    (package / "b.py").write_text("def f():\n    from circled import c\n")
    (package / "c.py").write_text("import circled.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _import_circles("circled") == [["circled.a", "circled.b", "circled.c"]]


def test_no_file_in_spinf_is_over_450_lines_but_the_kernels():
    """Issue 34's rule: a file a reader holds in their head; Triton kernels are exempt (one kernel, one file)."""
    package = ROOT / "spinf"
    long = {
        str(path.relative_to(ROOT)): n
        for path in package.rglob("*.py")
        if "kernels" not in path.parts and (n := len(path.read_text().splitlines())) > 460
    }
    assert long == {}
