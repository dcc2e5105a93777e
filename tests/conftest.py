"""Shared fixtures: the tiny model generated once per session into a private cache (nothing is downloaded)."""

from __future__ import annotations

import os
import tempfile

import pytest

# No test reaches GitHub: the official pack source (on by default in every server and catalog a test builds) fails
# at once on a closed loopback port, and the packs cache is the session's own, so no tag cached elsewhere is read.
# Tests of the GitHub client set their own base URL (a fake GitHub on loopback).
os.environ.setdefault("SPINF_GITHUB_API", "http://127.0.0.1:9")
os.environ.setdefault("SPINF_PACKS_CACHE", tempfile.mkdtemp(prefix="spinf-test-packs-"))

# Without a GPU, Triton kernels run through Triton's interpreter (it must be chosen before any kernel is defined).
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        from triton.runtime import interpreter as _interpreter
    except ImportError:
        _interpreter = None
    if _interpreter is not None and hasattr(_interpreter, "_patch_lang_tensor"):
        # The interpreter holds scalars as 1-element arrays and converts them for range() with int(), which
        # numpy >= 2.4 refuses; convert through .item() instead.
        _patch_tensor = _interpreter._patch_lang_tensor

        def _patch_lang_tensor(tensor, scope):
            _patch_tensor(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        _interpreter._patch_lang_tensor = _patch_lang_tensor
    if _interpreter is not None and hasattr(_interpreter, "InterpreterBuilder"):
        # The interpreter's tl.dot is numpy's matmul, whose BLAS gives an element low bits that depend on where it
        # sits in the product (edge blocks take other code paths). A GPU tensor-core product does not, and the
        # kernels' invariance rests on that, so on the CPU every element is summed the same way: in k order (in the
        # accumulator's dtype: numpy would sum int32 products in int64).
        import numpy as _np
        import triton.language as tl

        def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            a_data, b_data = a.data, b.data
            if (a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating()) or (
                b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()
            ):  # as the interpreter's own dot: fp8 operands through fp16
                a_data = _interpreter._convert_float(a_data, a.dtype, tl.float16, None).view(_np.float16)
                b_data = _interpreter._convert_float(b_data, b.dtype, tl.float16, None).view(_np.float16)
            dtype = d.data.dtype
            products = a_data.astype(dtype)[:, :, None] * b_data.astype(dtype)[None, :, :]
            return _interpreter.TensorHandle(_np.add.reduce(products, axis=1, dtype=dtype) + d.data, d.dtype.scalar)

        _interpreter.InterpreterBuilder.create_dot = _create_dot


def pytest_collection_modifyitems(config, items):
    """``slow``-marked tests (the long runs) run only when ``-m`` names them, as ``pytest -m slow`` does;
    ``gpu``-marked tests run on the GPU machine and skip elsewhere."""
    import torch

    if "slow" not in (config.option.markexpr or ""):
        long_run = pytest.mark.skip(reason="a long run: pytest -m slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(long_run)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("hub-cache")


@pytest.fixture(scope="session")
def tiny_engine(tiny_cache):
    from spinf import Engine

    return Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache)
