"""benchmarks/checkpoint.py on the CPU: the folder it writes loads, in our loader and transformers', to the weights
the in-memory builders draw; the reference's scale names cover its linears. The 31B's folder (benchmarks/gemma31b.py)
is a ``gemma4`` checkpoint that transformers loads with its vision tower, and its real shapes are transformers'; so
are the E4B's (benchmarks/gemma_e4b.py), whose folder transformers and our loader read to the same forward."""

from __future__ import annotations

import json
import math
import shutil
import types

import pytest
import torch
from torch import nn
from transformers import AutoConfig, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig
from transformers.models.gemma4_unified.modeling_gemma4_unified import Gemma4UnifiedTextModel

from benchmarks.checkpoint import reference_scales, text_state, weight_shapes, write_checkpoint
from benchmarks.gemma12b import (
    GEMMA_12B_TEXT_CONFIG,
    build_random_engine_model,
    build_random_transformers_model,
    decoder_linear_params,
    scaled,
)
from benchmarks.gemma31b import GEMMA_31B_TEXT_CONFIG, GEMMA_31B_VISION_CONFIG, scaled_31b, weight_bytes
from benchmarks.gemma_e4b import GEMMA_E4B_TEXT_CONFIG, scaled_e4b
from spinf.engine.attention import AttentionPlan
from spinf.engine.gemma4.loading import load_gemma4_text

CONFIG = scaled(GEMMA_12B_TEXT_CONFIG, layers=3, window=16)


def test_the_folder_holds_the_builders_weights_in_shards(tmp_path):
    folder = write_checkpoint(tmp_path, CONFIG, device=torch.device("cpu"), shard_bytes=2**20)
    index = json.loads((folder.path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # several shards
    assert all(key.startswith("model.language_model.") for key in index["weight_map"])
    loaded = load_gemma4_text(folder.path).state_dict()
    built = build_random_engine_model("cpu", torch.float32, config=CONFIG).state_dict()
    assert loaded.keys() == built.keys()
    assert all(torch.equal(built[k], loaded[k]) for k in loaded)
    again = write_checkpoint(tmp_path, CONFIG, device=torch.device("cpu"), shard_bytes=2**20)
    assert again.path == folder.path and again.write_s == 0.0 and folder.write_s > 0


def test_transformers_reads_the_folder_as_a_unified_checkpoint(tmp_path):
    folder = write_checkpoint(tmp_path, CONFIG, device=torch.device("cpu"))
    config = AutoConfig.from_pretrained(folder.path)
    assert config.model_type == "gemma4_unified" and config.text_config.num_hidden_layers == 3
    from_folder = build_random_transformers_model("cpu", torch.float32, config=CONFIG, state=text_state(folder.path))
    drawn = build_random_transformers_model("cpu", torch.float32, config=CONFIG)
    a, b = from_folder.state_dict(), drawn.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_reference_scales_name_every_linear_of_the_reference_model(tmp_path):
    folder = write_checkpoint(tmp_path, CONFIG, device=torch.device("cpu"))
    ours = {
        name: 2.0**-i
        for i, name in enumerate(build_random_engine_model("cpu", torch.float32, config=CONFIG).linear_names())
    }
    theirs = reference_scales(ours)
    with torch.device("meta"):
        model = Gemma4UnifiedTextModel(AutoConfig.from_pretrained(folder.path).text_config)
    linears = {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    assert linears <= theirs.keys()
    assert theirs["layers.1.self_attn.k_proj"] == ours["layers.1.wqkv"]
    assert theirs["layers.2.mlp.up_proj"] == ours["layers.2.w_gate_up"]
    assert theirs["layers.0.mlp.down_proj"] == ours["layers.0.w_down"]


def test_the_31b_folder_is_a_gemma4_checkpoint_with_its_tower(tmp_path):
    text, vision = scaled_31b()
    folder = write_checkpoint(tmp_path, text, device=torch.device("cpu"), shard_bytes=2**20, vision_config=vision)
    assert folder.model_id == "bench/gemma31b-random"
    index = json.loads((folder.path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert {key.split(".")[1] for key in index["weight_map"]} == {"language_model", "vision_tower", "embed_vision"}
    model, info = Gemma4ForConditionalGeneration.from_pretrained(folder.path, output_loading_info=True)
    assert model.config.model_type == "gemma4" and model.config.vision_config.num_hidden_layers == 2
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    loaded = load_gemma4_text(folder.path).state_dict()
    built = build_random_engine_model("cpu", torch.float32, config=text).state_dict()
    assert loaded.keys() == built.keys() and all(torch.equal(built[k], loaded[k]) for k in loaded)


def test_the_real_31b_shapes_are_transformers_own():
    config = AutoConfig.for_model(
        "gemma4",
        text_config={k: v for k, v in GEMMA_31B_TEXT_CONFIG.items() if k not in ("model_type", "architectures")},
        vision_config={k: v for k, v in GEMMA_31B_VISION_CONFIG.items() if k != "model_type"},
    )
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(config)
    theirs = {name: tuple(t.shape) for name, t in model.state_dict().items() if name != "lm_head.weight"}
    assert theirs == weight_shapes(GEMMA_31B_TEXT_CONFIG, GEMMA_31B_VISION_CONFIG)
    found = weight_bytes(GEMMA_31B_TEXT_CONFIG, GEMMA_31B_VISION_CONFIG)
    assert found["linear_params"] == 29_286_727_680  # benchmarks/gemma31b.md
    assert found["fp8s_text_bytes"] == 32_107_963_000 and found["vision_params"] == 575_743_536


def test_a_folder_with_no_room_is_refused_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: types.SimpleNamespace(total=10, used=9, free=1))
    with pytest.raises(OSError, match=r"^the checkpoint needs 0\.0 GiB and .* has 0\.0 GiB free"):
        write_checkpoint(tmp_path, CONFIG, device=torch.device("cpu"))
    assert list(tmp_path.iterdir()) == []


def test_the_e4b_folder_loads_in_transformers_and_ours_to_the_same_model(tmp_path):
    """The E4B's folder (`benchmarks.gemma_e4b`, scaled down): per-layer input weights and KV-shared layers where
    transformers saves them, so its loader finds every weight and nothing else, and both forwards agree."""
    text = scaled_e4b()
    folder = write_checkpoint(tmp_path, text, device=torch.device("cpu"), shard_bytes=2**20)
    assert folder.model_id == "bench/gemma-e4b-random"
    index = json.loads((folder.path / "model.safetensors.index.json").read_text())
    assert "model.language_model.layers.0.per_layer_input_gate.weight" in index["weight_map"]
    assert "model.language_model.layers.11.self_attn.k_proj.weight" not in index["weight_map"]  # KV-shared
    model, info = Gemma4ForConditionalGeneration.from_pretrained(
        folder.path, output_loading_info=True, attn_implementation="eager", dtype=torch.float64
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = load_gemma4_text(folder.path)
    assert ours.cfg.per_layer_size == 16 and [s.kv_shared for s in ours.cfg.layers] == [False] * 8 + [True] * 4
    ids = torch.randint(3, text["vocab_size"], (40,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = torch.log_softmax(model(input_ids=ids[None]).logits[0], dim=-1)
        got = ours.read_logprobs(ours(ids, AttentionPlan.for_sequence(len(ids)))).double()
    assert (got - expected).abs().max().item() <= 1e-4


def test_the_real_e4b_shapes_are_transformers_own():
    config = Gemma4TextConfig(
        **{k: v for k, v in GEMMA_E4B_TEXT_CONFIG.items() if k not in ("model_type", "architectures")}
    )
    with torch.device("meta"):
        model = Gemma4ForCausalLM(config)
    theirs = {name: tuple(t.shape) for name, t in model.state_dict().items() if name != "lm_head.weight"}
    ours = weight_shapes(GEMMA_E4B_TEXT_CONFIG)
    assert theirs == {"model." + k.removeprefix("model.language_model."): s for k, s in ours.items()}
    linears = sum(
        math.prod(s) for k, s in theirs.items() if k.endswith(("_proj.weight", "_gate.weight", "tion.weight"))
    )
    assert decoder_linear_params(GEMMA_E4B_TEXT_CONFIG) == linears
