"""benchmarks/gpu_fast.py end to end on a CPU with the scaled-down model: calibration, fp8s, the invariance
check, the parity recording and comparison, and its lines in a results file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "benchmarks/gpu_fast.py", "--device=cpu", "--scaled", "--repeats=1", "--min-seconds=0"]
    return subprocess.run([*command, *flags], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # over 15 s: the default run keeps to 10 minutes on 2 cores
def test_gpu_fast_runs_on_the_cpu_and_records_what_it_measured(tmp_path):
    results, reference = tmp_path / "RESULTS.md", tmp_path / "reference.json.gz"
    done = run(
        "--jobs=J1",
        "--max-inputs=2",
        "--invariance",
        "--max-alone=4",
        f"--parity-record={reference}",
        f"--results={results}",
    )
    assert done.returncode == 0, done.stderr
    text = results.read_text()
    assert "runner: `Engine.score` (the engine loop every caller uses), fp8s" in text
    assert re.search(r"^\| J1 \| engine, fp8s \| 112 \| ", text, re.M)  # 2 inputs × 56 questions
    differing = re.findall(r"invariance, [^:]+: (\d+) questions compared, (\d+) differ in any bit", text)
    assert len(differing) == 5 and all(int(n) > 0 and d == "0" for n, d in differing)
    assert "recorded to reference.json.gz" in text and reference.exists()
    again = run("--jobs=J1", "--max-inputs=1", f"--parity-reference={reference}", "--no-results")
    assert again.returncode == 0, again.stderr
    assert "vs reference: exact share 1.0, max abs 0.0" in again.stdout  # same seed, same scales: same bits


def test_the_timeline_asks_for_a_gpu():
    done = run("--jobs=J3", "--no-results", "--timeline=/tmp/nowhere")
    assert done.returncode == 2
    assert "--timeline times device passes with CUDA events" in done.stderr


def test_host_work_compares_the_collector_running_and_paused():
    command = [sys.executable, "benchmarks/host_work.py", "--jobs=J3", "--repeats=1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    line = r"J3: host work \d+\.\d\dx as long with the collector running as with it paused\n"
    assert re.fullmatch(line, done.stdout)
