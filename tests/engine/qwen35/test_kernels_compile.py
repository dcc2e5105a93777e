"""Qwen3.5's row kernels compiled for a Hopper GPU (sm_90) on any machine: Triton's CUDA backend turns each into a
cubin without a device, so what only a GPU compile catches (a plain global read inside a jit function, a shape the
interpreter lets through) fails here, not on the GPU. The interpreter's tests (test_qwen_rows.py,
test_int4_kernels.py) check the numbers. The tests here run without a GPU under Triton's interpreter, whose kernels
do not compile, so the compiling runs in a child process without it (this file run as a script)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def cases() -> list:
    """(kernel, signature, constants): each kernel with the constants the engine launches it with."""
    from spinf.engine.kernels import int4, qwen_rows

    rows = {"inner": "i32", "gu_row": "i32"}
    found = [
        (
            qwen_rows._silu_mul_kernel,
            {"gu_ptr": "*bf16", "out_ptr": out, "scale_ptr": "*fp32", **rows},
            {"BF16": True, "BLOCKS": blocks, "QUANT": quant},
        )
        for out, quant, blocks in (("*bf16", False, 2), ("*i8", True, 8))
    ] + [
        (
            qwen_rows._gated_norm_kernel,
            {"o_ptr": "*bf16", "z_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "z_row": "i32",
             "heads": "i32", "dv": "i32", "eps": "fp32"},
            {"HEADS": 16, "BF16": True, "BLOCK": 128},
        ),
    ] + [
        (
            qwen_rows._sigmoid_mul_kernel,
            {"a_ptr": "*bf16", "g_ptr": "*bf16", "out_ptr": out, "scale_ptr": "*fp32", "width": "i32", "g_row": "i32",
             "d": "i32", "head_stride": "i32"},
            {"BF16": True, "BLOCKS": 8, "QUANT": quant},
        )  # fmt: skip
        for out, quant in (("*bf16", False), ("*i8", True))
    ] + [
        (
            qwen_rows._qk_rope_kernel,
            {"x_ptr": "*bf16", "w_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": "*bf16",
             "x_row": "i32", "head_stride": "i32", "cos_row": "i32", "heads": "i32", "d": "i32", "rotary": "i32",
             "eps": "fp32", "scale": "fp32"},
            {"HEADS": 8, "BF16": True, "BLOCK": 256},
        ),
    ] + [
        (
            int4._split_kernel,
            {"h_ptr": "*bf16", "w_ptr": "*bf16", "keep_ptr": "*i8", "idx_ptr": "*i64", "x_ptr": "*bf16",
             "q_ptr": "*i8", "scale_ptr": "*fp32", "xo_ptr": "*fp16", "K": "i32", "C": "i32", "eps": "fp32",
             "offset": "fp32"},
            {"NORM": norm, "WRITE_X": norm, "BF16": True, "BK": 1024, "BC": 128},
        )
        for norm in (False, True)
    ] + [
        (
            int4._quantize_blocks_kernel,
            {"x_ptr": "*bf16", "q_ptr": "*i8", "scale_ptr": "*fp32", "M": "i32", "K": "i32"},
            {"BR": 16},
        ),
    ]  # fmt: skip
    return found


def main() -> None:
    """Compile every case for sm_90; print one line per case, ``ok`` or what failed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for kernel, signature, constants in cases():
        name = f"{kernel.__name__} {constants}"
        try:
            source = ASTSource(
                fn=kernel, signature={**signature, **dict.fromkeys(constants, "constexpr")}, constexprs=constants
            )
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
            print(f"ok {name}" if "cubin" in compiled.asm else f"FAILED {name}: no cubin", flush=True)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, with its cause
            print(f"FAILED {name}: {(exc.__cause__ or exc)!r}"[:2000].replace("\n", " "), flush=True)


def test_the_row_kernels_compile_for_hopper():
    pytest.importorskip("triton")
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("Triton has no CUDA backend here")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr[-3000:]
    assert len([line for line in lines if line.startswith(("ok ", "FAILED "))]) == len(cases()), done.stdout
    assert not [line for line in lines if line.startswith("FAILED")], "\n".join(lines)


if __name__ == "__main__":
    main()
