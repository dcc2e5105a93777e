"""benchmarks/breakdown.py: its categories on a made-up profiler trace, its coverage of our Triton kernels, and the
CPU smoke run end to end."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks import breakdown as b

ROOT = Path(__file__).resolve().parents[2]
HOST, GPU = 1, 7  # thread ids: the engine's thread, the GPU stream
DIMS = {"Input Dims": [[100, 3840], [3840, 8192], [], []]}


def span(cat, name, ts, dur, tid=HOST, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def launch(ts, correlation, name="cudaLaunchKernel"):
    return span("cuda_runtime", name, ts, 1, correlation=correlation)


def kernel(name, ts, dur, correlation, cat="kernel"):
    return span(cat, name, ts, dur, tid=GPU, correlation=correlation)


HOST_SIDE = [
    span("cpu_op", "aten::_scaled_mm", 0, 10, **DIMS),
    launch(5, 1),
    launch(6, 2),  # the same op's split-K reduction
    span("cpu_op", "aten::_scaled_mm", 12, 8, **{"Input Dims": [[28, 3840], [3840, 8192], [], []]}),
    span("cpu_op", "aten::empty", 13, 1),  # a child that ended before the launch
    launch(15, 3),
    span("cpu_op", "aten::addmm", 21, 5, **{"Input Dims": [[8192], [4, 3840], [3840, 8192], [], []]}),
    launch(22, 14),
    span("cuda_driver", "cuLaunchKernelEx", 30, 1, correlation=4),  # Triton launches outside any op
    span("cuda_driver", "cuLaunchKernelEx", 31, 1, correlation=5),
    span("cuda_driver", "cuLaunchKernelEx", 32, 1, correlation=6),
    span("cuda_driver", "cuLaunchKernelEx", 33, 1, correlation=15),
    span("user_annotation", b.HEAD_RANGE, 40, 20),
    span("cpu_op", "aten::mm", 41, 4, **{"Input Dims": [[128, 3840], [3840, 262144]]}),
    launch(42, 7),
    span("cuda_driver", "cuLaunchKernelEx", 50, 1, correlation=8),
    span("cpu_op", "aten::index", 52, 3),
    launch(53, 9),
    span("cpu_op", "aten::mul", 61, 2),
    launch(62, 10),
    launch(65, 11, "cudaGraphLaunch"),
    span("cpu_op", "aten::copy_", 70, 5),
    launch(71, 12, "cudaMemcpyAsync"),
    launch(80, 13),
    span("cpu_op", "aten::_scaled_mm", 85, 3, **{"Input Dims": [[50, 3840], [3840, 1024]], "External id": 99}),
    {"ph": "i", "cat": "kernel", "name": "marker", "ts": 90, "tid": GPU},  # not a span
]
GPU_SIDE = [
    kernel("nvjet_qqtst_128x256_64x4_1x2_h_bz_coopA_TNT", 1000, 50, 1),
    kernel("splitKreduce_kernel", 1050, 10, 2),
    kernel("nvjet_qqtst_64x64", 1060, 20, 3),
    kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 1080, 4, 14),
    kernel("_tree_attention_kernel", 1100, 40, 4),  # 16 us idle before it
    kernel("_add_norm_kernel", 1140, 6, 5),
    kernel("_norm_kernel", 1146, 4, 6),
    kernel("_qkv_kernel", 1150, 5, 15),
    kernel("sm90_xmma_gemm_bf16bf16_f32f32", 1155, 30, 7),
    kernel("_softcap_lse_kernel", 1185, 5, 8),
    kernel("void at::native::index_elementwise_kernel<128, 4>", 1190, 2, 9),
    kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", 1192, 3, 10),
    kernel("nvjet_qqtst_256x128", 1200, 7, 11),  # 5 us idle before it; three kernels of one graph replay
    kernel("_gelu_mul_kernel", 1207, 2, 11),
    kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", 1209, 1, 11),
    kernel("Memcpy DtoH (Device -> Pinned)", 1210, 10, 12, cat="gpu_memcpy"),
    kernel("mystery_kernel", 1215, 5, 13),  # overlaps the copy: the GPU's busy union counts 1215..1220 once
    {**kernel("nvjet_qqtst_64x8", 1220, 8, 16), "args": {"correlation": 16, "External id": 99}},  # no launch
]


def test_each_kernel_falls_into_its_category():
    rows = b.categorise(HOST_SIDE + GPU_SIDE, wall_us=300)
    assert {r.category: r.us for r in rows} == {
        b.HOST: 93,  # 300 - the busy union 207 (84 + 95 + 28)
        "GEMM 8,192×3,840": 84,
        "GEMM 1,024×3,840": 8,  # its launch missing: tied to its op by the kernel's External id
        b.ATTENTION: 40,
        b.HEAD: 37,
        b.NORM_QUANT: 10,
        b.COPIES: 10,
        b.GEMM_UNKNOWN: 7,
        b.ROTARY: 5,
        b.OTHER: 5,
        b.TORCH: 4,
        b.GLU: 2,
    }
    assert [r.us for r in rows] == sorted((r.us for r in rows), reverse=True)
    by = {r.category: r for r in rows}
    gemm = by["GEMM 8,192×3,840"]
    # three ops (the split-K reduction is its op's, not another launch): rows 100 + 28 + 4
    assert gemm.detail == "3 launches, 132 rows in all (aten::_scaled_mm, aten::addmm)"
    assert gemm.flops == 2.0 * 132 * 8192 * 3840
    assert by[b.HEAD].detail == "3 kernels; 128 rows through the head GEMM in 1 launches"
    assert by[b.HEAD].flops == 0.0
    assert by[b.TORCH].detail == "2 kernels: aten::mul 0.00 ms, in a CUDA graph replay 0.00 ms"
    assert by["GEMM 1,024×3,840"].detail == "1 launches, 50 rows in all (aten::_scaled_mm)"
    # idle between the first and the last kernel: 228 - 207 = 21 us; the rest of the 93 before and after
    assert by[b.HOST].detail == "between kernels 0.02 ms, before the first and after the last 0.07 ms"


def test_the_table_gives_shares_of_the_wall_time_and_the_gemm_rates():
    rows = b.categorise(HOST_SIDE + GPU_SIDE, wall_us=300)
    lines = b.table(rows, 300, passes=2)
    gemm = next(line for line in lines if line.startswith("| GEMM 8,192×3,840 |"))
    rate = 2.0 * 132 * 8192 * 3840 / 84 / 1e6  # TFLOP/s
    assert gemm.split(" | ")[1:5] == ["0.08", "0.04", "28.0%", f"{rate:,.0f}"]
    assert lines[-2].startswith("| all GEMMs (the LM head apart) | 0.10 | 0.05 | 33.0% |")  # 84 + 8 + 7 us
    assert lines[-1].startswith("| sum of the rows (overlap counts twice) | 0.30 | 0.15 | 101.7% |")  # 212 + 93 us


def test_a_trace_without_gpu_work_is_all_host_time():
    rows = b.categorise([span("cpu_op", "aten::mm", 0, 10, **DIMS)], wall_us=50)
    assert rows == [b.Row(b.HOST, 50, "no GPU activity")]


def test_gemm_shapes_skip_a_bias_and_refuse_operands_that_do_not_chain():
    assert b.gemm_shape([[8192], [4, 3840], [3840, 8192]]) == (4, 8192, 3840)
    assert b.gemm_shape([[4, 3840], [8192, 3840]]) is None
    assert b.gemm_shape([]) is None


def test_the_head_range_counts_read_rows_and_gives_the_method_back():
    import torch

    class Model:
        def option_logprobs(self, hidden_rows, pick_rows):
            return hidden_rows.sum() + pick_rows

    model, rows = Model(), []
    with b.head_range(model, rows):
        assert model.option_logprobs(torch.ones(5, 2), 1).item() == 11.0
        model.option_logprobs(torch.ones(3, 2), pick_rows=0)
    assert rows == [5, 3]
    assert model.option_logprobs.__func__ is Model.option_logprobs  # the method again, not the wrapper


def test_every_triton_kernel_of_the_engine_has_a_category():
    found = set()
    for path in (ROOT / "spinf" / "engine" / "kernels").glob("*.py"):
        found |= set(re.findall(r"@triton\.jit(?:\([^)]*\))?\s*\ndef (\w+_kernel)\(", path.read_text()))
    assert found and found == set(b.KERNEL_CATEGORIES)


def test_the_cpu_smoke_run_appends_its_tables(tmp_path):
    results = tmp_path / "RESULTS.md"
    command = [sys.executable, "benchmarks/breakdown.py", "--device=cpu", "--scaled", "--jobs=J1", "--max-inputs=1"]
    done = subprocess.run(
        [*command, "--repeats=1", f"--results={results}", f"--trace-dir={tmp_path / 'traces'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = results.read_text()
    assert "## Where a call's time goes (J1) — " in text
    assert re.search(r"^\*\*J1\*\* \(its first body\): 56 questions, [\d,]+ tokens run in 1 passes; ", text, re.M)
    assert re.search(
        r"^\| host gaps \(GPU idle\) \| [\d.,]+ \| [\d.,]+ \| 100\.0% \|  \| no GPU activity \|$", text, re.M
    )
    trace = json.loads(gzip.decompress((tmp_path / "traces" / "J1.json.gz").read_bytes()))
    assert any(e.get("name") == "aten::embedding" for e in trace["traceEvents"])


def test_fla_s_chunked_kernels_have_their_own_category():
    from spinf.engine.kernels.chunked import PINNED_KERNELS

    for name in PINNED_KERNELS:  # as the profiler names a Triton launch: the function, then its arguments
        assert b.classify({"name": f"{name}(args)", "cat": "kernel"}, ()) == (b.CHUNKED, name, None)
    other = {"name": "chunked_copy_kernel", "cat": "kernel"}  # "chunk" alone is not fla's prefix
    assert b.classify(other, ())[0] == b.OTHER
