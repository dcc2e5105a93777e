"""benchmarks/versus.py end to end on a CPU with the scaled-down model: the folder, ours in-process, a real
``spinf-serve serve`` child answering concurrent and sequential calls, the baseline, the lines and the figures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # over 15 s: the default run keeps to 10 minutes on 2 cores
def test_versus_runs_on_the_cpu_and_records_what_it_measured(tmp_path):
    results, figures = tmp_path / "RESULTS.md", tmp_path / "versus.json"
    command = [
        sys.executable,
        "benchmarks/versus.py",
        "--device=cpu",
        "--scaled",
        "--baseline",
        "--max-inputs=3",
        "--rounds=1",
        "--http-rounds=1",
        "--latency-calls=10",
        "--server-warmup=none",
        f"--work={tmp_path / 'work'}",
        f"--results={results}",
        f"--json={figures}",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = results.read_text()
    assert "## Ours against the reference engine (spinf-serve 0.1.1) on the scaled-down" in text
    for job, questions in (("J1", 3 * 56), ("J2", 3 * 106), ("J3", 20)):
        assert re.search(rf"^\| {job} \| ours, in-process, one call[^|]* \| {questions} \| ", text, re.M)
    http = re.search(r"3 concurrent calls \(one input × 106 questions each\).*statuses \{200: 3\}.*", text)
    assert http and "318 questions against the in-process call: 0 differ in any bit" in http[0]
    assert re.search(r"p50 \d+\.\d ms, p99 \d+\.\d ms over 10 calls", text)
    assert "the server exited with 0 after SIGTERM" in text
    assert "| reference | not run: spinf-serve 0.1.1 needs a GPU |" in text
    assert re.search(r"^\| J1 \| baseline \(transformers, prefix cache\) \| 168 \| ", text, re.M)
    found = json.loads(figures.read_text())
    assert found["ours"]["J2"]["questions"] == 318 and found["http"]["J2"]["ratio"] > 0
    assert (tmp_path / "work" / "server.log").exists()
