"""benchmarks/checkpoint.py on the CPU: the folder it writes loads, in our loader and transformers', to the weights
the in-memory builders draw; the reference's scale names cover its linears."""

from __future__ import annotations

import json

import torch
from torch import nn
from transformers import AutoConfig
from transformers.models.gemma4_unified.modeling_gemma4_unified import Gemma4UnifiedTextModel

from benchmarks.checkpoint import reference_scales, text_state, write_checkpoint
from benchmarks.gemma12b import (
    GEMMA_12B_TEXT_CONFIG,
    build_random_engine_model,
    build_random_transformers_model,
    scaled,
)
from spinf.engine.model import load_gemma4_text

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
