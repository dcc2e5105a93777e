"""benchmarks/qwen_rows.py on the CPU under Triton's interpreter: every setting runs, is compared with the engine's
settings and comes back as a table line; the module's settings are put back after each; a table goes to --results."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")


def test_the_sweep_tries_each_setting_against_the_engines(tmp_path):
    from benchmarks import qwen_rows as bench
    from spinf.engine.kernels import qwen_rows

    before = (qwen_rows.GATE_COLUMNS, qwen_rows.GATE_WARPS, qwen_rows.CONV_COLUMNS, qwen_rows.CONV_WARPS)
    results = tmp_path / "RESULTS.md"
    bench.main(["--device", "cpu", "--rows", "2", "--kernels", "gate", "--results", str(results)])
    assert (qwen_rows.GATE_COLUMNS, qwen_rows.GATE_WARPS, qwen_rows.CONV_COLUMNS, qwen_rows.CONV_WARPS) == before
    text = results.read_text()
    assert "## Qwen3.5 row kernels: program sizes and warps at 2 rows" in text
    lines = re.findall(r"^\| (gate) \| (.*?) \| – \| (same|DIFFER) \|$", text, re.M)
    gate = [settings for kernel, settings, _ in lines if kernel == "gate"]
    assert gate[0] == f"GATE_COLUMNS {before[0]}, GATE_WARPS {before[1]} (the engine's)"
    assert len(gate) == 16 and len(set(gate)) == 16  # the engine's first, then the 15 others, none twice
    # the interpreter runs a program's lanes in one order whatever its warps: every setting gives the same bits
    assert {bits for _, _, bits in lines} == {"same"}


def test_a_kernel_it_does_not_know_is_refused(capsys):
    from benchmarks import qwen_rows as bench

    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--kernels", "conv,nope"])
    assert "unknown kernels ['nope']" in capsys.readouterr().err
