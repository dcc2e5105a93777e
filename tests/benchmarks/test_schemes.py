"""benchmarks/schemes.py end to end on a CPU with the scaled-down model: the probe, every scheme emulated, the head
modes, the lines and the figures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ("bf16", "fp8s", "fp8", "fp8row", "w8a16", "w8a8")


@pytest.mark.slow  # over 15 s: the default run keeps to 10 minutes on 2 cores
def test_schemes_runs_on_the_cpu_and_records_what_it_measured(tmp_path):
    results, figures = tmp_path / "RESULTS.md", tmp_path / "schemes.json"
    command = [
        sys.executable,
        "benchmarks/schemes.py",
        "--device=cpu",
        "--scaled",
        "--max-inputs=3",
        "--rounds=1",
        "--latency-calls=3",
        f"--work={tmp_path / 'work'}",
        f"--results={results}",
        f"--json={figures}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = results.read_text()
    assert "## The Gemma schemes (engine spec B.8) on the scaled-down 12B-shaped random model" in text
    probe = re.findall(r"^\| (qkv|o|gate_up|down) \| \d+ x \d+ \| (.*) \|$", text, re.M)
    assert [name for name, _ in probe] == ["qkv", "o", "gate_up", "down"]
    assert all(set(cells.split(" | ")) <= {"none", "–"} for _, cells in probe)  # the CPU's products are row-stable
    for scheme in SCHEMES:
        for job, questions in (("J1", 3 * 56), ("J2", 3 * 106), ("J3", 20)):
            assert re.search(rf"^\| {job} \| {scheme} \| {questions} \| ", text, re.M), (scheme, job)
    for scheme in SCHEMES[1:]:
        assert re.search(rf"\| Δ \| {scheme} against bf16: max abs Δ log-prob J1 [\d.e-]+, J2 [\d.e-]+ \|", text)
    for mode in ("bf16", "fp32"):
        assert re.search(rf"\| Δ \| fp8s, lm-head {mode} against f32out: max abs Δ log-prob J1 [\d.e-]+ \|", text)
    found = json.loads(figures.read_text())
    assert set(found["schemes"]) == set(SCHEMES) and set(found["heads"]) == {"f32out", "bf16", "fp32"}
    assert found["schemes"]["w8a8"]["J2"]["max_dlogprob"] > 0 and found["schemes"]["bf16"]["J1"]["questions_per_s"] > 0


def test_on_a_gpu_the_folder_is_served_as_a_catalog_model_that_allows_every_gemma_scheme(tmp_path, monkeypatch):
    from benchmarks.checkpoint import Folder
    from benchmarks.schemes import widened_manifest
    from spinf.catalog import resolve_model
    from spinf.catalog.manifest import GEMMA_SCHEMES

    folder = Folder(tmp_path / "folder", "0123abcd" * 5, 0, 0.0, True)
    monkeypatch.setenv("SPINF_MANIFEST_DIRS", str(widened_manifest(tmp_path, folder)))
    resolved = resolve_model(folder.model_id)
    assert resolved.manifest.quant_allowed == GEMMA_SCHEMES and resolved.revision == folder.revision
    assert resolved.batch_invariant  # a catalog model: fp8s shares passes, as for the models we ship
