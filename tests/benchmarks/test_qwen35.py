"""benchmarks/qwen35.py on the CPU, the tiny shape: its random int4 checkpoint is one the engine opens (the published
layout: GPTQ v1 tensors, the outlier table, a sharded index), and a job set runs through it end to end. The 27B
figures come from the GPU (benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import qwen35
from spinf.engine.qwen35.int4 import read_gptq_config, read_outliers


def test_the_tiny_run_writes_an_int4_checkpoint_the_engine_serves(tmp_path, capsys):
    qwen35.main(["--root", str(tmp_path), "--shape", "tiny", "--device", "cpu", "--jobs", "J3", "--max-inputs", "1"])
    out = capsys.readouterr().out
    assert "| J3 | ours, int4-i8 |" in out
    # the rows counted by compiling the bodies are the tokens the engine ran; J3's content runs chunked from its BOS
    ran = re.search(r"^\| J3 \| ours, int4-i8 \|[^|]+\|[^|]+\|[^|]+\| ([\d,]+) \|", out, re.M)
    share = re.search(r"^\| J3 \| rows in fixed prefixes of at least 64 [^:]+: ([\d,]+) of ([\d,]+) \(", out, re.M)
    assert ran and share and share[2] == ran[1] and 0 < int(share[1].replace(",", "")) < int(ran[1].replace(",", ""))
    folder = tmp_path / "hub" / "models--spinf--qwen3.8-27b-int4" / "snapshots" / qwen35.REVISION
    assert read_gptq_config(folder) is not None and len(read_outliers(folder)) == 6 * 2  # qkv or in_proj, gate/up
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv.qweight" in index
    assert "model.language_model.layers.0.linear_attn.in_proj_b.weight" in index  # b/a stay float


def test_the_27b_shape_has_the_spec_s_sizes():
    text = qwen35.SHAPES["27b"]
    assert text["layer_types"].count("full_attention") == 16 and len(text["layer_types"]) == 64
    # about 13 GB of packed int4 weights with fp16 group scales for the 64 layers (engine spec B.14.3)
    quantized = sum(
        out * width
        for name, (out, width) in qwen35.linear_shapes(text).items()
        if not name.endswith(("in_proj_b", "in_proj_a"))
    )
    assert 12.5e9 < quantized * (0.5 + 2 / 32) < 14.5e9


@pytest.mark.slow
def test_the_tiny_run_times_extraction_and_generation_slots(tmp_path, capsys):
    """``--extraction``: benchmarks/extraction.py's slot calls on the Qwen stack (about 30 s on a 2-core machine)."""
    argv = ["--root", str(tmp_path), "--shape", "tiny", "--device", "cpu", "--jobs", "J3", "--max-inputs", "1"]
    qwen35.main([*argv, "--extraction", "1"])
    out = capsys.readouterr().out
    assert "| +8 generated 32-token slots per input | full_length | 8 |" in out
    assert "| 256 |" in out  # 8 slots × 32 decode steps, every one run at full length


def test_the_transformers_baseline_scores_what_the_engine_scores_on_the_tiny_qwen(tmp_path):
    """The baseline (benchmarks.baseline on transformers' Qwen3_5ForCausalLM, built by `transformers_qwen35`) on the
    tiny float twin: each content once into the cache, its linear-attention states copied per row of a batch."""
    import copy

    import torch

    from benchmarks.baseline import run_baseline
    from spinf import Engine
    from spinf.engine.qwen35.tiny import write_tiny_qwen35
    from tests.benchmarks.test_baseline import MIXED_BODY, TOLERANCE, engine_logprobs, flat, j1_small

    folder = write_tiny_qwen35(tmp_path / "float")
    engine = Engine(str(folder), device="cpu")
    model = qwen35.transformers_qwen35(folder, torch.device("cpu"), torch.float32)
    # rows split over batches, or not; batches of one row (single tokens take transformers' decode path, which
    # updates the conv state in place: the content's must stay as it was for the next batch)
    for body, batch in ((MIXED_BODY, 3), (MIXED_BODY, 64), (j1_small(), 3), (j1_small(), 1)):
        expected = flat(engine_logprobs(engine.score(copy.deepcopy(body))))
        got, _ = run_baseline(model, engine.tokenizer, copy.deepcopy(body), batch=batch)
        assert len(flat(got)) == len(expected)
        assert max(abs(a - b) for a, b in zip(flat(got), expected, strict=True)) <= TOLERANCE


def test_the_tiny_run_compares_with_the_baseline_on_the_same_int4_folder(tmp_path, capsys):
    qwen35.main(["--root", str(tmp_path), "--shape", "tiny", "--device", "cpu", "--jobs", "J3", "--max-inputs", "1",
                 "--baseline", "--batch", "8"])  # fmt: skip
    out = capsys.readouterr().out
    assert "| J3 | baseline, transformers " in out and "prefix cache, batch 8 |" in out
    assert "| J3 | ours / baseline: " in out
