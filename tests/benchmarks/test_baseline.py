"""The benchmark pieces on the CPU: the transformers baseline against the engine, the random 12B-shaped builders
against the checkpoint loader and each other, and a smoke run of the GPU job-set script on a scaled-down model."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from benchmarks.baseline import run_baseline, run_baseline_stats
from benchmarks.gemma12b import (
    GEMMA_12B_TEXT_CONFIG,
    build_random_engine_model,
    build_random_transformers_model,
    check_12b_shape,
    decoder_linear_params,
    random_checkpoint,
    scaled,
    transformers_config,
)
from benchmarks.jobsets import j1_body
from spinf.engine.attention import AttentionPlan
from spinf.engine.compiler import compile_request
from spinf.engine.gemma4.config import parse_text_config
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.engine.gemma4.model import Gemma4Text

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4  # fp32 rounding differences between the two attention paths (as the oracle test allows)


def engine_logprobs(response: dict) -> list:
    return [
        [[[o["logprob"] for o in c["options"]] for c in q["combinations"]] for q in r["queries"]]
        for r in response["results"]
    ]


def flat(nested) -> list[float]:
    if isinstance(nested, list):
        return [x for item in nested for x in flat(item)]
    return [nested]


@pytest.fixture(scope="module")
def hf_tiny(tiny_engine):
    return AutoModelForCausalLM.from_pretrained(tiny_engine.folder, dtype=torch.float32).eval()


def j1_small() -> dict:
    body = j1_body(num_contents=2)
    query = body["scoring"]["queries"][0]
    query["combinations"] = query["combinations"][:8]
    return body


MIXED_BODY = {
    "inputs": [
        {"id": "a", "messages": [{"content": "The parcel arrived late and the box was damaged."}]},
        {"id": "b", "messages": [{"content": "Great service, thanks!"}]},
    ],
    "scoring": {
        "queries": [
            # no tokens of its own: read at the content's last token (and the floor at BOS)
            {"id": "empty", "template": "{?}", "options": [" yes", " no"]},
            # " rise" and " rising" are two tokens with the same first one in the tiny tokenizer
            {"id": "multi", "template": "\n\nThe price will{?}", "options": [" rise", " fall", " rising"]},
        ]
    },
}


@pytest.mark.parametrize("batch", [3, 64])
@pytest.mark.parametrize("body", [j1_small(), MIXED_BODY], ids=["j1", "mixed"])
def test_baseline_matches_the_engine_on_the_tiny_model(tiny_engine, hf_tiny, body, batch):
    expected = engine_logprobs(tiny_engine.score(copy.deepcopy(body)))
    got, seconds = run_baseline(hf_tiny, tiny_engine.tokenizer, copy.deepcopy(body), batch=batch)
    assert seconds > 0
    assert [[len(q) for q in r] for r in got] == [[len(q) for q in r] for r in expected]
    assert len(flat(got)) == len(flat(expected))
    worst = max(abs(a - b) for a, b in zip(flat(got), flat(expected), strict=True))
    assert worst <= TOLERANCE


def test_baseline_runs_each_content_once_and_batches_its_questions(tiny_engine, hf_tiny):
    body = j1_small()  # 2 contents of ~470 tokens (past the tiny model's 32-token window) × 8 questions
    prompt = compile_request(tiny_engine.parse(copy.deepcopy(body)), tiny_engine.tokenizer, tiny_engine.shape)
    assert all(len(ci.prefix) > 32 for ci in prompt.inputs)
    _, stats, _ = run_baseline_stats(hf_tiny, tiny_engine.tokenizer, body, batch=3)
    # 2 contents + the floors' BOS content, then ceil(8 / 3) batches for each of the three
    assert stats.passes == 3 + 3 * 3
    content_tokens = sum(len(ci.prefix) for ci in prompt.inputs) + 1
    assert stats.tokens > content_tokens


def test_random_engine_model_has_the_state_dict_load_gemma4_text_produces(tmp_path):
    config = scaled(GEMMA_12B_TEXT_CONFIG, window=16)
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(random_checkpoint(config, device="cpu", dtype=torch.float32), tmp_path / "model.safetensors")
    loaded = load_gemma4_text(tmp_path).state_dict()
    built = build_random_engine_model("cpu", torch.float32, config=config).state_dict()
    assert {k: (v.shape, v.dtype) for k, v in built.items()} == {k: (v.shape, v.dtype) for k, v in loaded.items()}
    assert all(torch.equal(built[k], loaded[k]) for k in loaded)  # same seed, same fused weights


def test_random_transformers_and_engine_models_agree():
    config = scaled(GEMMA_12B_TEXT_CONFIG, window=16)
    ours = build_random_engine_model("cpu", torch.float32, config=config)
    theirs = build_random_transformers_model("cpu", torch.float32, config=config)
    assert theirs.lm_head.weight is theirs.model.embed_tokens.weight
    ids = torch.randint(3, config["vocab_size"], (50,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = torch.log_softmax(theirs(ids[None]).logits[0].float(), dim=-1)
        got = ours.read_logprobs(ours(ids, AttentionPlan.for_sequence(50)))
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_the_12b_config_has_the_spec_shape():
    count = check_12b_shape()
    assert 10.85e9 < count < 10.95e9
    cfg = parse_text_config(GEMMA_12B_TEXT_CONFIG)
    full = [i for i, spec in enumerate(cfg.layers) if not spec.is_sliding]
    assert full == list(range(5, 48, 6))
    assert {(s.head_dim, s.num_kv_heads, s.k_eq_v, s.rope_fraction) for s in cfg.layers if not s.is_sliding} == {
        (512, 1, True, 0.25)
    }
    assert {(s.head_dim, s.num_kv_heads, s.k_eq_v) for s in cfg.layers if s.is_sliding} == {(256, 8, False)}
    assert (cfg.hidden_size, cfg.num_heads, cfg.vocab_size, cfg.sliding_window) == (3840, 16, 262_144, 1024)
    # the count against both module definitions, built on meta
    with torch.device("meta"):
        ours = Gemma4Text(cfg)
        theirs = AutoModelForCausalLM.from_config(transformers_config(GEMMA_12B_TEXT_CONFIG))
    linear = {"wqkv", "wo", "w_gate_up", "w_down"}  # ours, fused
    linear |= {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # transformers'
    for model in (ours, theirs):
        assert sum(p.numel() for n, p in model.named_parameters() if linear & set(n.split("."))) == count
    assert decoder_linear_params(scaled(GEMMA_12B_TEXT_CONFIG)) < 1e6


def test_gpu_jobsets_script_runs_on_the_cpu(tmp_path):
    results = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_jobsets.py",
            "--device=cpu",
            "--scaled",
            "--baseline",
            "--jobs=J1,NOPE",
            "--max-inputs=2",
            "--repeats=1",
            "--min-seconds=0",
            f"--results={results}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "NOPE:" in done.stdout and "skipped" in done.stdout
    text = results.read_text()
    assert "## Job sets on the scaled-down 12B-shaped random model" in text
    assert "runner: `Engine.score` (the engine loop every caller uses)" in text and "tiny tokenizer" in text
    assert "written as a checkpoint folder" in text
    assert re.search(r"^\| J1 \| engine, fp32 \| 112 \| ", text, re.M)  # 2 inputs × 56 questions
    assert re.search(r"^\| J1 \| baseline \| 112 \| ", text, re.M)
    diff = float(re.search(r"max abs Δ logprob (\S+)", text).group(1))
    assert diff <= TOLERANCE  # the two models hold the same random weights
