"""benchmarks/gemm_probe.py: its command on a machine without a GPU says what it needs and exits non-zero."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the probe runs (pytest -m gpu does not time it)")
def test_without_a_gpu_the_probe_says_it_needs_one():
    run = subprocess.run(
        [sys.executable, "benchmarks/gemm_probe.py", "--rows", "64"], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert run.stdout == "" and "CUDA device" in run.stderr
