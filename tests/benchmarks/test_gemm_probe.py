"""benchmarks/gemm_probe.py: its command on a machine without a GPU says what it needs and exits non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_without_a_gpu_the_probe_says_it_needs_one():
    hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # on the GPU machine too: the probe sees no device
    run = subprocess.run(
        [sys.executable, "benchmarks/gemm_probe.py", "--rows", "64"],
        cwd=ROOT,
        env=hidden,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert run.stdout == "" and "CUDA device" in run.stderr
