"""The Gemma 4 mixture-of-experts blocks (the 26B A4B: router, top-k experts beside the dense MLP) against
transformers' own classes, scaled down on the CPU.

transformers builds the model from a small ``Gemma4TextConfig`` with ``enable_moe_block`` (four layers, eight
experts of which each token reaches three), draws random weights at a trained model's scales and saves it with
``save_pretrained``; the tiny tokenizer goes beside it. Our loader must read every weight; whole sequences must
match transformers' forward (fp64, its eager experts) within 1e-4, in both layouts transformers writes (a bare text
model and the Hub's, with a vision tower beside); the engine's answers must match the plain-transformers oracle and
a question's numbers must not depend on what shares its pass; ``spinf-serve serve FOLDER`` must answer
``/v1/score`` with the engine's numbers. Under fp8s each expert gets its own input scale, and an expert calibration
never reached takes its layer's largest. The GPU path is tests/engine/test_gpu_moe.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig

from spinf.engine.attention import AttentionPlan
from spinf.engine.gemma4 import fp8_static
from spinf.engine.gemma4.config import read_text_config
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.engine.quant import AmaxRecorder
from spinf.engine.scales import ScaleTableMismatch
from spinf.engine.tiny_tokenizer import tokenizer_files
from spinf.errors import ModelError
from tests.engine import test_gemma4_31b as gemma31b
from tests.engine import test_gemma4_small as small
from tests.engine import test_independence as independence
from tests.engine.extraction import test_decode_exact as decode_exact
from tests.engine.test_gemma4_31b import randomized

S, F = "sliding_attention", "full_attention"
TEXT = {
    "vocab_size": 8192,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "global_head_dim": 64,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,  # as in the 26B A4B: full layers' keys serve as values
    "sliding_window": 32,
    "layer_types": [S, S, S, F],
    "final_logit_softcapping": 30.0,
    "hidden_size_per_layer_input": 0,
    "enable_moe_block": True,
    "num_experts": 8,
    "top_k_experts": 3,
    "moe_intermediate_size": 32,
}
WINDOW = TEXT["sliding_window"]
REFERENCE = {"attn_implementation": "eager", "experts_implementation": "eager", "dtype": torch.float64}


def write_checkpoint(path, model_class=Gemma4ForCausalLM, config=None):
    """The tiny MoE model as transformers saves it, with the tiny tokenizer beside it."""
    torch.manual_seed(0)
    randomized(model_class(config or Gemma4TextConfig(**TEXT))).save_pretrained(path)
    for name, data in tokenizer_files().items():
        (path / name).write_bytes(data)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("gemma4-moe"))


@pytest.fixture(scope="module")
def models(folder):
    """Ours in fp32 and transformers' in fp64 (the exact answer of its definition; see test_gemma4_small.py)."""
    reference = Gemma4ForCausalLM.from_pretrained(folder, **REFERENCE)
    return load_gemma4_text(folder), reference.eval()


def test_the_folder_reads_as_a_moe_model(folder):
    saved = json.loads((folder / "config.json").read_text())
    assert saved["enable_moe_block"] is True and saved["architectures"] == ["Gemma4ForCausalLM"]
    cfg, _ = read_text_config(folder)
    assert (cfg.num_experts, cfg.top_k_experts, cfg.moe_intermediate_size) == (8, 3, 32)
    assert all(spec.moe for spec in cfg.layers)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_experts": None}, r"num_experts must be a positive integer, not None$"),
        ({"top_k_experts": 9}, r"top_k_experts = 9 is more than num_experts$"),
    ],
)
def test_a_config_without_sensible_expert_sizes_is_refused(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**TEXT, "model_type": "gemma4_text", **change}))
    with pytest.raises(ModelError, match=message):
        read_text_config(tmp_path)


def test_a_pre_quantized_moe_checkpoint_is_refused(folder, monkeypatch):
    """Its experts' fp8 layout is not one the loader knows: refused by name rather than read as float."""
    monkeypatch.setattr(fp8_static, "is_fp8_static", lambda folder: True)
    with pytest.raises(ModelError, match=r"pre-quantized MoE checkpoint \(the 26B A4B\) is not read: use a bf16 one$"):
        load_gemma4_text(folder)


def test_the_loader_reads_every_text_weight(folder, models):
    ours, reference = models
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert "model.layers.0.experts.gate_up_proj" in names and "model.layers.3.router.per_expert_scale" in names
    text = reference.model.state_dict()
    assert sum(t.numel() for t in ours.state_dict().values()) == sum(t.numel() for t in text.values())
    assert torch.equal(ours.layers[2].moe.down, text["layers.2.experts.down_proj"].float())


@pytest.mark.parametrize("length", [1, WINDOW - 1, WINDOW + 1, 3 * WINDOW + 5])
def test_whole_sequences_match_transformers(models, length):
    ours, reference = models
    ids = torch.randint(3, TEXT["vocab_size"], (length,), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        expected = torch.log_softmax(reference(input_ids=ids[None]).logits[0], dim=-1)
        got = ours.read_logprobs(ours(ids, AttentionPlan.for_sequence(length))).double()
    assert (got - expected).abs().max().item() <= 1e-4


def test_the_experts_change_the_answer(models):
    """Guards the test above: with one expert's down projection zeroed the hidden states move."""
    ours, _ = models
    ids = torch.randint(3, TEXT["vocab_size"], (40,), generator=torch.Generator().manual_seed(1))
    plan = AttentionPlan.for_sequence(40)
    moe = ours.layers[1].moe
    with torch.inference_mode():
        base = ours(ids, plan)
        down = moe.down.clone()
        moe.down[3] = 0
        try:
            without = ours(ids, plan)
        finally:
            moe.down.copy_(down)
    assert (base - without).abs().max().item() > 1e-2


def test_every_token_reaches_its_top_k_and_ties_go_to_the_lower_expert(models):
    moe = models[0].layers[0].moe
    normed = torch.randn(50, TEXT["hidden_size"], generator=torch.Generator().manual_seed(2))
    weights, experts = moe.route(normed)
    assert experts.shape == (50, 3) and all(len(set(row)) == 3 for row in experts.tolist())
    assert torch.allclose((weights / moe.expert_scale[experts]).sum(-1), torch.ones(50))
    router = moe.router.detach().clone()
    try:
        moe.router.data = torch.zeros_like(router)  # every logit equal
        assert moe.route(normed)[1].tolist() == [[0, 1, 2]] * 50
    finally:
        moe.router.data = router


def test_the_hub_layout_with_a_vision_tower(tmp_path):
    """The 26B A4B as the Hub holds it (``Gemma4ForConditionalGeneration``): the text model's experts under
    ``model.language_model.``, the tower beside, unread."""
    vision = {k: v for k, v in gemma31b.VISION.items() if k not in ("model_type", "dtype")}
    config = Gemma4Config(text_config=TEXT, vision_config=vision, vision_soft_tokens_per_image=280)
    path = write_checkpoint(tmp_path, Gemma4ForConditionalGeneration, config)
    reference = Gemma4ForConditionalGeneration.from_pretrained(path, **REFERENCE).eval()
    ours = load_gemma4_text(path)
    ids = torch.randint(12, TEXT["vocab_size"], (50,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = torch.log_softmax(reference(input_ids=ids[None]).logits[0], dim=-1)
        got = ours.read_logprobs(ours(ids, AttentionPlan.for_sequence(50))).double()
    assert (got - expected).abs().max().item() <= 1e-4


def test_fp8s_scales_each_expert_and_fills_the_unreached(folder, models):
    """Calibration names each expert's projections; under fp8s an expert without a scale takes its layer's largest
    for that projection, each expert's product is its e4m3 emulation, and a layer without any expert scale is
    refused."""
    plain, _ = models
    ids = torch.randint(3, TEXT["vocab_size"], (60,), generator=torch.Generator().manual_seed(4))
    recorder = AmaxRecorder()
    with torch.inference_mode(), plain.observing(recorder.observe):
        plain(ids, AttentionPlan.for_sequence(60))
    scales = recorder.scales()
    assert {"layers.0.experts.0.gate_up", "layers.3.experts.7.down", "layers.0.w_gate_up"} <= set(scales)
    kept = {name: scale for name, scale in scales.items() if not name.startswith("layers.1.experts.5.")}
    moe = load_gemma4_text(folder, scales=kept).layers[1].moe
    stacked = moe.fp8["down"]
    assert stacked.inputs[5] == max(kept[f"layers.1.experts.{e}.down"] for e in range(8) if e != 5)
    assert stacked.data.dtype == torch.float8_e4m3fn and moe.down.numel() == 0  # the float weights released
    act = torch.randn(20, TEXT["moe_intermediate_size"], generator=torch.Generator().manual_seed(5))
    act = act * stacked.inputs[5] * 100  # within the scale's range: quantizing rounds, never clips
    with torch.inference_mode():
        got = moe._product("down", 5, act, "", None)
    expected = act @ plain.layers[1].moe.down[5].t()
    relative = ((got - expected).norm() / expected.norm()).item()
    assert 1e-4 < relative < 0.1, relative  # e4m3's three mantissa bits, on both operands
    without_layer = {name: scale for name, scale in scales.items() if not name.startswith("layers.2.experts.")}
    with pytest.raises(ScaleTableMismatch, match=r"^the scale table has no scale for any expert's layers\.2\."):
        load_gemma4_text(folder, scales=without_layer)


# the engine on the MoE model answers as the plain-transformers oracle does (as on the small models)
tiny_engine = small.tiny_engine
test_the_engines_answers_match_the_oracle = small.test_the_engines_answers_match_the_oracle

# a question's numbers do not depend on what shares its pass (tests/engine/test_independence.py, on this model)
alone = independence.alone
test_each_question_alone_equals_all_together = independence.test_each_question_alone_equals_all_together
test_with_300_other_questions = independence.test_with_300_other_questions
test_with_other_inputs_and_in_another_order = independence.test_with_other_inputs_and_in_another_order


# extraction decodes through the experts too (tests/engine/extraction)
ref = decode_exact.ref
test_greedy_generation_equals_the_reference_token_for_token = (
    decode_exact.test_greedy_generation_equals_the_reference_token_for_token
)


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


# ``spinf-serve serve FOLDER`` answers /v1/score with the engine's numbers (a real server process)
test_serving_the_folder_answers_score = gemma31b.test_serving_the_folder_answers_score
