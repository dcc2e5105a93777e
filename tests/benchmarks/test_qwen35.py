"""benchmarks/qwen35.py on the CPU, the tiny shape: its random int4 checkpoint is one the engine opens (the published
layout: GPTQ v1 tensors, the outlier table, a sharded index), and a job set runs through it end to end. The 27B
figures come from the GPU (benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from benchmarks import qwen35
from spinf.engine.qwen35.gptq import read_gptq_config
from spinf.engine.qwen35.outliers import read_outliers


def test_the_tiny_run_writes_an_int4_checkpoint_the_engine_serves(tmp_path, capsys):
    argv = ["--root", str(tmp_path), "--shape", "tiny", "--device", "cpu", "--jobs", "J3", "--max-inputs", "1"]
    qwen35.main([*argv, "--breakdown"])
    out = capsys.readouterr().out
    assert "| J3 | ours, int4-i8 |" in out
    # --breakdown: one profiled call's table (on the CPU no GPU work, so all of it is host time)
    # its pass count follows the CPU's pace (max_pass_s), so a busy machine may cut the call in two
    assert re.search(r"^\*\*J3\*\* where the time goes .*: 20 questions, [\d,]+ tokens run in \d+ passes", out, re.M)
    assert re.search(r"^\| host gaps \(GPU idle\) \| [\d,.]+ \| [\d,.]+ \| 100\.0% \|", out, re.M)
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


@pytest.mark.slow  # 24 s on two cores: the default run keeps within ten minutes
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


@pytest.mark.parametrize("group", [64, -1])
def test_a_checkpoint_of_another_group_is_written_as_gptq_tools_write_it(tmp_path, group):
    from safetensors import safe_open

    from spinf.engine.qwen35.gptq import unpack_gptq

    text = qwen35.SHAPES["tiny"]
    folder = qwen35.write_random_int4(tmp_path / "snapshot", text, torch.device("cpu"), group=group)
    assert read_gptq_config(folder).group_size == group
    assert json.loads((folder / "quantize_config.json").read_text())["group_size"] == group
    name = "model.language_model.layers.0.mlp.down_proj"  # 128 inputs, 64 outputs
    with safe_open(str(folder / "model-00001.safetensors"), framework="pt") as f:
        parts = {f"{name}.{p}": f.get_tensor(f"{name}.{p}") for p in ("qweight", "qzeros", "scales", "g_idx")}
    size = 128 if group == -1 else group
    assert parts[f"{name}.scales"].shape == (128 // size, 64) and parts[f"{name}.qzeros"].shape == (128 // size, 8)
    assert torch.equal(parts[f"{name}.g_idx"], torch.arange(128, dtype=torch.int32) // size)
    assert unpack_gptq(parts, name, group).group == size  # as the engine reads it, with the config's group


def test_the_27b_shape_takes_groups_of_128_and_whole_rows_the_tiny_one_not_128():
    text = qwen35.SHAPES["27b"]
    assert set(qwen35.group_inputs(text, 128).values()) == {128}
    assert set(qwen35.group_inputs(text, -1).values()) == {5120, 17_408, 6144}  # hidden, intermediate, 24 or 48 × 128
    with pytest.raises(SystemExit):
        qwen35.parse_args(["--shape", "tiny", "--groups", "32,128"])  # the tiny model is 64 wide


def test_the_tiny_run_compares_groups_side_by_side(tmp_path, capsys):
    argv = ["--root", str(tmp_path), "--shape", "tiny", "--device", "cpu", "--jobs", "J3", "--max-inputs", "1"]
    qwen35.main([*argv, "--groups", "32,64", "--repeats", "1", "--results", str(tmp_path / "RESULTS.md")])
    out = capsys.readouterr().out
    assert "## Qwen3.8-27B int4 (tiny shape, GPTQ group 32, group 64) — " in (tmp_path / "RESULTS.md").read_text()
    assert "| J3 | ours, int4-i8, GPTQ group 64 |" in out
    assert re.search(r"^\| J3 \| group 32 \| [\d,]+ \| – \| – \| 1\.000× \|$", out, re.M)
    assert re.search(r"^\| J3 \| group 64 \| [\d,]+ \| – \| – \| \d\.\d{3}× \|$", out, re.M)
    assert read_gptq_config(qwen35.snapshot_folder(tmp_path, 64)).group_size == 64
    assert read_gptq_config(qwen35.snapshot_folder(tmp_path, 32)).group_size == 32


@pytest.mark.slow  # about 20 s on two cores: a real server process loads and warms the tiny model
def test_the_tiny_run_serves_the_folder_over_http_with_the_in_process_bits(tmp_path, capsys):
    """``--http``: a real ``spinf-serve serve`` process on the folder, J3 one call after another and J1 as concurrent
    calls, compared bit for bit with the in-process answers."""
    argv = ["--root", str(tmp_path), "--shape", "tiny", "--device", "cpu", "--jobs", "J3,J1", "--max-inputs", "2"]
    qwen35.main([*argv, "--repeats", "1", "--http", "3"])
    out = capsys.readouterr().out
    assert re.search(r"^\| setup \| `spinf-serve serve .+` ready in [\d.]+ s \|", out, re.M)
    j3 = r"^\| J3 \| over HTTP, 3 calls one after another .* 20 questions against the in-process call: 0 differ in"
    j1 = r"^\| J1 \| over HTTP, 2 concurrent calls .*statuses \[200\]; \d+ questions .*: 0 differ in any bit"
    assert re.search(j3, out, re.M) and re.search(j1, out, re.M)
    assert "| setup | the server exited with 0 after SIGTERM |" in out
