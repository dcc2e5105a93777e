"""The README's engine example runs as written (its first ```python block), and its tiny Qwen example writes outside
the checkout and serves a short name."""

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_engine_example_runs_and_prints_every_option(monkeypatch, tiny_cache):
    monkeypatch.setenv("HF_HUB_CACHE", str(tiny_cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tiny_cache))
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {})
    rows = [re.fullmatch(r"(\w+) ('[^']*') (\S+) (\S+)", line).groups() for line in out.getvalue().splitlines()]
    assert [(query, option) for query, option, _, _ in rows] == [
        ("refund", "' yes'"),
        ("refund", "' no'"),
        ("tone", "' angry'"),
        ("tone", "' calm'"),
        ("tone", "' neutral'"),
    ]
    probabilities = [float(p) for _, _, p, _ in rows]
    assert abs(sum(probabilities[:2]) - 1) < 1e-5 and abs(sum(probabilities[2:]) - 1) < 1e-5


def test_readme_qwen_example_writes_outside_the_checkout_and_serves_a_short_name(tmp_path):
    """The tiny Qwen example writes its folder under /tmp, not into the checkout, and serves it as ``tiny-qwen``
    (a local folder is served under its path unless SPINF_SERVED_MODEL names it). Run here with the folder moved
    under the test's own; ``config`` stands in for ``serve``, whose settings it prints."""
    block = next(b for b in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S) if "write_tiny_qwen35" in b)
    write, serve = block.strip().splitlines()
    assert "'/tmp/tiny-qwen'" in write and serve.endswith("serve /tmp/tiny-qwen --device cpu")
    folder = tmp_path / "tiny-qwen"
    root = README.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_")}
    words = shlex.split(write.replace("/tmp/tiny-qwen", str(folder)))
    subprocess.run([sys.executable, *words[1:]], cwd=root, env=env, check=True, timeout=120)
    assert (folder / "model.safetensors").is_file() and not (root / "tiny-qwen").exists()
    assignment, *command = shlex.split(serve.replace("/tmp/tiny-qwen", str(folder)))
    name, _, value = assignment.partition("=")
    assert command[:2] == ["spinf-serve", "serve"]
    shown = subprocess.run(
        [sys.executable, "-m", "spinf", "config", *command[2:]],
        cwd=root,
        env=env | {name: value},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 'engine.served_model = "tiny-qwen"' in shown and f'engine.model = "{folder}"' in shown
