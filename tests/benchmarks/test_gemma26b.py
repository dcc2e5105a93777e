"""The 26B A4B's shape (benchmarks/gemma26b.py): transformers' own weight shapes, the published parameter counts,
and a scaled-down random folder that transformers and our loader both read as the benchmarks draw it."""

from __future__ import annotations

import torch
from transformers import AutoConfig, Gemma4ForConditionalGeneration

from benchmarks.checkpoint import PREFIX, weight_shapes, write_checkpoint
from benchmarks.gemma12b import build_random_engine_model, decoder_linear_params
from benchmarks.gemma26b import GEMMA_26B_A4B_TEXT_CONFIG, expert_params, scaled_26b
from benchmarks.gpu_fast import parse_args
from benchmarks.shapes import model_config, model_title
from spinf.engine.gemma4.loading import load_gemma4_text


def test_the_real_26b_a4b_shapes_are_transformers_own():
    text = {k: v for k, v in GEMMA_26B_A4B_TEXT_CONFIG.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(AutoConfig.for_model("gemma4", text_config=text))
    theirs = {name: tuple(t.shape) for name, t in model.state_dict().items() if name.startswith(PREFIX)}
    assert theirs == weight_shapes(GEMMA_26B_A4B_TEXT_CONFIG)
    embedding = 262_144 * 2816
    active = decoder_linear_params(GEMMA_26B_A4B_TEXT_CONFIG)
    everything = active + expert_params() * 120 // 128  # the experts a token does not reach
    # the model card's "25.2B total, 3.8B active" (the vision tower's ~0.55B beside, not counted)
    assert round((everything + embedding) / 1e9, 1) == 25.2 and round((active + embedding) / 1e9, 1) == 3.8


def test_gpu_fast_measures_the_shape():
    args = parse_args(["--shape", "26b-a4b", "--device", "cpu"])
    assert model_config(args) == GEMMA_26B_A4B_TEXT_CONFIG and model_title(args) == "the 26B-A4B-shaped random model"
    assert model_config(parse_args(["--shape", "26b-a4b", "--scaled"])) == scaled_26b()
    assert model_config(parse_args(["--shape", "26b-a4b", "--layers", "2"]))["num_hidden_layers"] == 2


def test_the_scaled_folder_is_read_alike_by_transformers_and_our_loader(tmp_path):
    text = scaled_26b()
    folder = write_checkpoint(tmp_path, text, device=torch.device("cpu"), shard_bytes=2**20)
    assert folder.model_id == "bench/gemma26b-a4b-random"
    model, info = Gemma4ForConditionalGeneration.from_pretrained(folder.path, output_loading_info=True)
    assert model.config.text_config.enable_moe_block and model.config.text_config.num_experts == 16
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    loaded = load_gemma4_text(folder.path).state_dict()
    built = build_random_engine_model("cpu", torch.float32, config=text).state_dict()
    assert loaded.keys() == built.keys() and all(torch.equal(built[k], loaded[k]) for k in loaded)
    assert loaded["layers.5.moe.gate_up"].shape == (16, 32, 64)
