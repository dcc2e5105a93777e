"""The 31B's layout (``gemma4``: transformers' ``Gemma4ForConditionalGeneration``, the text config nested, a vision
tower beside the text model; engine spec B.19) against transformers' own module, scaled down on the CPU.

transformers builds the model from a scaled-down 31B config (`benchmarks.gemma31b.scaled_31b`: two periods of five
sliding layers and one full layer, 2 query heads per KV head on sliding layers and 8 on full ones with 2 KV heads
there whose keys serve as values, the global head dim twice the sliding one, a two-layer vision tower), draws random
weights, and saves it with ``save_pretrained``; the tiny tokenizer goes beside it. Our loader reads the folder in
fp32 and must leave the vision tower's weights alone; the log-probs of whole sequences must match transformers'
forward, the engine's answers must match the plain-transformers oracle (tests/engine/oracle.py), and
``spinf-serve serve FOLDER --device cpu`` must answer ``/v1/score`` with the engine's numbers.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch
from safetensors import safe_open
from transformers import Gemma4Config, Gemma4ForConditionalGeneration

from benchmarks.gemma31b import scaled_31b
from contrib.loadtest.harness import ServerProcess, score_body
from spinf import Engine
from spinf.engine.attention import AttentionPlan
from spinf.engine.gemma4.config import read_text_config
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.engine.gemma4.tiny import snapshot_files
from tests.engine.oracle import Oracle
from tests.engine.test_oracle import CHOSEN, check_combination, chosen_queries

TEXT, VISION = scaled_31b()
WINDOW = TEXT["sliding_window"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def randomized(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Weights at the scales of a trained model (transformers' initialiser draws ``N(0, 0.02²)`` and unit norms,
    which would leave every distribution flat): norms ``1 + N(0, 0.1²)``, embeddings ``N(0, 0.35²)``, matrices
    ``N(0, 1/in)``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.dim() == 1:
                param.copy_(1 + 0.1 * noise)
            elif "embed_tokens" in name:
                param.copy_(0.35 * noise)
            else:
                param.copy_(noise / math.sqrt(param.shape[-1]))
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4-31b-scaled")
    text = {k: v for k, v in TEXT.items() if k not in ("model_type", "architectures", "dtype")}
    vision = {k: v for k, v in VISION.items() if k not in ("model_type", "dtype")}
    config = Gemma4Config(text_config=text, vision_config=vision, vision_soft_tokens_per_image=280)
    torch.manual_seed(0)
    randomized(Gemma4ForConditionalGeneration(config)).save_pretrained(path)
    files = snapshot_files()
    for name in TOKENIZER_FILES:
        (path / name).write_bytes(files[name])
    return path


@pytest.fixture(scope="module")
def models(folder):
    reference = Gemma4ForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    )
    return load_gemma4_text(folder), reference.eval()


def test_the_folder_reads_as_the_31b_layout(folder):
    saved = json.loads((folder / "config.json").read_text())
    assert saved["model_type"] == "gemma4" and saved["text_config"]["model_type"] == "gemma4_text"
    assert saved["vision_config"]["model_type"] == "gemma4_vision"
    cfg, prefix = read_text_config(folder)
    assert prefix == "model.language_model." and cfg.sliding_window == WINDOW and len(cfg.layers) == 12
    assert [spec.is_sliding for spec in cfg.layers] == ([True] * 5 + [False]) * 2
    sliding = {(s.head_dim, s.num_kv_heads, s.k_eq_v, s.rope_fraction) for s in cfg.layers if s.is_sliding}
    full = {(s.head_dim, s.num_kv_heads, s.k_eq_v, s.rope_fraction) for s in cfg.layers if not s.is_sliding}
    assert cfg.num_heads == 16 and sliding == {(32, 8, False, 1.0)} and full == {(64, 2, True, 0.25)}


def test_the_loader_leaves_the_vision_tower_alone(folder, models):
    ours, reference = models
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert any(n.startswith("model.vision_tower.") for n in names)
    assert any(n.startswith("model.embed_vision.") for n in names)
    text = reference.model.language_model.state_dict()  # q/k/v and gate/up apart: the same numbers, unfused
    assert sum(t.numel() for t in ours.state_dict().values()) == sum(t.numel() for t in text.values())
    assert torch.equal(ours.embed.weight, text["embed_tokens.weight"])


@pytest.mark.parametrize("length", [1, WINDOW - 1, WINDOW + 1, 3 * WINDOW + 5])
def test_whole_sequences_match_transformers(models, length):
    ours, reference = models
    ids = torch.randint(3, TEXT["vocab_size"], (length,), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        expected = torch.log_softmax(reference(input_ids=ids[None]).logits[0].float(), dim=-1)
        got = ours.read_logprobs(ours(ids, AttentionPlan.for_sequence(length)))
    assert (got - expected).abs().max().item() <= 1e-4  # fp32 rounding: at most 5.5e-5 measured


@pytest.fixture(scope="module")
def engine(folder):
    return Engine(str(folder), device="cpu")


@pytest.mark.parametrize("name", ["several inputs", "the cut"])
def test_the_engines_answers_match_the_oracle(engine, folder, name):
    body, oracle = CHOSEN[name], Oracle(folder)
    for inp, result in zip(body["inputs"], engine.score(body)["results"], strict=True):
        wanted = chosen_queries(body, inp)
        expected = oracle.score_input(inp["messages"][0]["content"][0]["text"], wanted, body["scoring"])
        for got_query, combos in zip(result["queries"], expected, strict=True):
            for got, (main, floor) in zip(got_query["combinations"], combos, strict=True):
                check_combination(got, main, floor)


def test_serving_the_folder_answers_score(tmp_path, folder, engine):
    body = score_body(sentences=4, questions=3)
    server = ServerProcess(tmp_path, "--warmup", "none", model=str(folder))
    try:
        answer = httpx.post(f"{server.url}/v1/score", json=body, timeout=60)
    finally:
        assert server.stop() == 0
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"] == engine.score(body)["results"]
