"""benchmarks/side_by_side.py: two source trees on one folder, compared bit for bit and as a questions/s ratio."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.side_by_side import compare

ROOT = Path(__file__).resolve().parent.parent.parent


def _run(questions: int, seconds: list[float], logprobs: list[str]) -> dict:
    return {"jobs": {"J1": {"questions": questions, "seconds": seconds, "logprobs": logprobs, "peak_gib": 1.0}}}


def test_the_same_bits_and_pace_hold():
    runs = {"before": [_run(100, [1.0, 1.0], ["0x1p-1"])], "after": [_run(100, [0.99, 1.01], ["0x1p-1"])]}
    rows, held = compare(runs, ["J1"])
    assert held and "0 differ in any bit" in rows[0]


def test_one_differing_bit_or_a_slower_tree_fails():
    quarter = (0.25).hex()
    bits = {"before": [_run(100, [1.0], ["0x1p-1", quarter])], "after": [_run(100, [1.0], ["0x1p-1", quarter])]}
    assert compare(bits, ["J1"])[1]
    bits["after"] = [_run(100, [1.0], ["0x1p-1", (0.25 + 2**-54).hex()])]  # the last bit of the mantissa
    rows, held = compare(bits, ["J1"])
    assert not held and "1 differ in any bit" in rows[0]
    slow = {"before": [_run(100, [1.0], ["0x1p-1"])], "after": [_run(100, [1.05], ["0x1p-1"])]}
    assert not compare(slow, ["J1"])[1]


@pytest.mark.slow
def test_this_tree_against_itself_on_the_cpu(tmp_path):
    """The whole command on the CPU: a copy of this tree's spinf as the other tree, the scaled model, J3."""
    before = tmp_path / "before"
    shutil.copytree(ROOT / "spinf", before / "spinf")
    command = [sys.executable, str(ROOT / "benchmarks/side_by_side.py"), "--before", str(before)]
    done = subprocess.run(
        [*command, "--work", str(tmp_path / "work"), "--device", "cpu", "--jobs", "J3", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert "| J3 | 20 |" in done.stdout, done.stdout + done.stderr
    assert "0 differ in any bit" in done.stdout
