"""The README's engine example runs as written (its first ```python block)."""

import contextlib
import io
import re
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
