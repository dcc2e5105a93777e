"""The small Gemma 4 models (E2B/E4B: per-layer input embeddings, KV-shared layers with double-wide MLPs) against
transformers' own ``Gemma4ForCausalLM``, scaled down on the CPU.

transformers builds the model from a small ``Gemma4TextConfig`` (eight layers, the last three KV-shared: a full,
a sliding and a full layer that read the keys and values of layers 2 and 4), draws random weights at a trained
model's scales, and saves it with ``save_pretrained``; the tiny tokenizer goes beside it. Our loader must read
every weight; whole sequences must match transformers' forward within 1e-4, the engine's answers the
plain-transformers oracle (tests/engine/oracle.py), its generation the extraction reference, and a question's
numbers must not depend on what shares its pass; ``spinf-serve serve FOLDER`` must answer ``/v1/score`` with the
engine's numbers. In the Hub's layout (a vision tower beside), image rows must match transformers' handling of
their per-layer inputs. Files in the Hub's layout also hold keys' and values' weights for the KV-shared layers,
which nothing reads: the loader leaves them unread. The GPU path: tests/engine/test_gpu_small_gemma.py.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import attrs
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig

from spinf import Engine
from spinf.engine.attention import AttentionPlan
from spinf.engine.gemma4 import fp8_static
from spinf.engine.gemma4.config import parse_text_config, read_text_config
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.engine.loop import Call
from spinf.engine.tiny_tokenizer import tokenizer_files
from spinf.errors import ModelError
from tests.engine import test_gemma4_31b as gemma31b
from tests.engine import test_independence as independence
from tests.engine.extraction import test_decode_exact as decode_exact
from tests.engine.oracle import Oracle
from tests.engine.qwen35.hf_checkpoint import check_scores
from tests.engine.test_gemma4_31b import randomized
from tests.engine.test_oracle import CHOSEN

S, F = "sliding_attention", "full_attention"
TEXT = {
    "vocab_size": 8192,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "global_head_dim": 64,
    "sliding_window": 32,
    "layer_types": [S, S, F, S, S, F, S, F],
    "final_logit_softcapping": 30.0,
    "hidden_size_per_layer_input": 16,
    "vocab_size_per_layer_input": 8192,
    "num_kv_shared_layers": 3,
    "use_double_wide_mlp": True,
}
WINDOW = TEXT["sliding_window"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4-small")
    torch.manual_seed(0)
    randomized(Gemma4ForCausalLM(Gemma4TextConfig(**TEXT))).save_pretrained(path)
    for name, data in tokenizer_files().items():  # the tiny model's tokenizer, as its snapshot has it
        (path / name).write_bytes(data)
    return path


@pytest.fixture(scope="module")
def models(folder):
    """Ours in fp32 and transformers' in fp64: each fp32 forward is within 1e-4 of the fp64 one (at most 9e-5
    measured, transformers' own fp32 up to 8.7e-5), so two fp32 forwards may differ by a little more than 1e-4 at
    the tail of a long sequence; fp64 is the exact answer of transformers' definition."""
    reference = Gemma4ForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float64)
    return load_gemma4_text(folder), reference.eval()


def test_the_folder_reads_as_a_small_model(folder):
    saved = json.loads((folder / "config.json").read_text())
    assert saved["model_type"] == "gemma4_text" and saved["architectures"] == ["Gemma4ForCausalLM"]
    cfg, prefix = read_text_config(folder)
    assert prefix == "model." and cfg.per_layer_size == 16 and cfg.per_layer_vocab == 8192
    assert [spec.kv_shared for spec in cfg.layers] == [False] * 5 + [True] * 3
    assert [spec.wide_mlp for spec in cfg.layers] == [False] * 5 + [True] * 3


def test_the_loader_reads_every_text_weight(folder, models):
    ours, reference = models
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert "model.embed_tokens_per_layer.weight" in names and "model.layers.5.self_attn.k_proj.weight" not in names
    text = reference.model.state_dict()  # q/k/v and gate/up apart: the same numbers, unfused
    assert sum(t.numel() for t in ours.state_dict().values()) == sum(t.numel() for t in text.values())
    assert torch.equal(ours.embed_per_layer.weight, text["embed_tokens_per_layer.weight"].float())


@pytest.mark.parametrize("length", [1, WINDOW - 1, WINDOW + 1, 3 * WINDOW + 5])
def test_whole_sequences_match_transformers(models, length):
    ours, reference = models
    ids = torch.randint(3, TEXT["vocab_size"], (length,), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        expected = torch.log_softmax(reference(input_ids=ids[None]).logits[0], dim=-1)
        got = ours.read_logprobs(ours(ids, AttentionPlan.for_sequence(length))).double()
    assert (got - expected).abs().max().item() <= 1e-4


def test_the_shared_layers_change_the_answer(models):
    """Guards the test above: without their per-layer table the model's hidden states move."""
    ours, _ = models
    ids = torch.randint(3, TEXT["vocab_size"], (40,), generator=torch.Generator().manual_seed(1))
    plan = AttentionPlan.for_sequence(40)
    with torch.inference_mode():
        base = ours(ids, plan)
        table = ours.embed_per_layer.weight
        ours.embed_per_layer.weight = torch.nn.Parameter(torch.zeros_like(table), requires_grad=False)
        try:
            without = ours(ids, plan)
        finally:
            ours.embed_per_layer.weight = table
    assert (base - without).abs().max().item() > 1e-2


def test_a_kind_without_a_producer_is_refused():
    raw = {**TEXT, "model_type": "gemma4_text", "layer_types": [S, S, S, S, S, F, S, F]}
    with pytest.raises(ModelError, match=r"^num_kv_shared_layers = 3: no earlier layer of kind 'full_attention'"):
        parse_text_config(raw)


def test_the_unread_weights_of_shared_layers_in_hub_files_are_left_unread(folder, models, tmp_path):
    """The Hub's E2B/E4B files keep k/v projections and k norms in the shared layers (transformers skips them on
    load); the same model with them added loads to the same weights."""
    ours, _ = models
    hub = tmp_path / "hub-layout"
    shutil.copytree(folder, hub)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 - safe_open is no dict
    for shared, producer in {5: 2, 6: 4, 7: 2}.items():  # a layer of the same kind gives the shapes
        for name in ("k_proj", "v_proj", "k_norm"):
            source = tensors[f"model.layers.{producer}.self_attn.{name}.weight"]
            tensors[f"model.layers.{shared}.self_attn.{name}.weight"] = torch.randn_like(source)
    save_file(tensors, hub / "model.safetensors", metadata={"format": "pt"})
    loaded = load_gemma4_text(hub)
    assert loaded.state_dict().keys() == ours.state_dict().keys()
    assert all(torch.equal(t, ours.state_dict()[k]) for k, t in loaded.state_dict().items())


def test_a_pre_quantized_checkpoint_is_refused(folder, monkeypatch):
    """Its shared layers' and per-layer inputs' fp8 layout is untried: refused by name rather than misread."""
    monkeypatch.setattr(fp8_static, "is_fp8_static", lambda folder: True)
    with pytest.raises(ModelError, match=r"a pre-quantized E2B/E4B checkpoint is not read: use a bf16 one$"):
        load_gemma4_text(folder)


def test_the_layers_setting_keeps_the_first_layers_per_layer_inputs(folder, models):
    ours, _ = models
    cut = load_gemma4_text(folder, layers=6)
    ids = torch.randint(3, TEXT["vocab_size"], (20,), generator=torch.Generator().manual_seed(2))
    plan = AttentionPlan.for_sequence(20)
    with torch.inference_mode():
        h = cut.embed(ids) * torch.tensor(TEXT["hidden_size"] ** 0.5)
        assert torch.equal(cut.per_layer_inputs(ids, h, plan), ours.per_layer_inputs(ids, h, plan)[:, :6])
        assert cut(ids, plan).shape == (20, TEXT["hidden_size"])


@pytest.fixture(scope="module")
def with_vision(tmp_path_factory):
    """The layout a Hub E2B/E4B checkpoint has (``Gemma4ForConditionalGeneration``, a vision tower beside the text
    model), the tiny tokenizer's image token as its placeholder: ours and transformers' (fp64) on that folder."""
    path = tmp_path_factory.mktemp("gemma4-small-vision")
    vision = {k: v for k, v in gemma31b.VISION.items() if k not in ("model_type", "dtype")}
    config = Gemma4Config(text_config=TEXT, vision_config=vision, vision_soft_tokens_per_image=280, image_token_id=8)
    torch.manual_seed(0)
    randomized(Gemma4ForConditionalGeneration(config)).save_pretrained(path)
    reference = Gemma4ForConditionalGeneration.from_pretrained(path, attn_implementation="eager", dtype=torch.float64)
    return load_gemma4_text(path), reference.eval()


def image_rows():
    """60 token ids with image placeholders (id 8) at rows 20-28, the image's embeddings there, and the same as
    transformers' ``mm_encoder_outputs``: (ids, rows, image, outputs)."""
    ids = torch.randint(12, TEXT["vocab_size"], (60,), generator=torch.Generator().manual_seed(3))
    rows = torch.arange(20, 29)
    ids[rows] = 8
    image = torch.randn(len(rows), TEXT["hidden_size"], generator=torch.Generator().manual_seed(4))
    outputs = {"image": SimpleNamespace(pooler_output=[image.double()])}
    return ids, rows, image, outputs


def test_image_rows_match_transformers_per_layer_inputs(with_vision):
    """Image placeholders take the given embeddings, and their per-layer inputs look up the pad token's row (the
    placeholder's own row would move the answer by several nats) while the projection reads the image rows."""
    ours, reference = with_vision
    ids, rows, image, outputs = image_rows()
    with torch.inference_mode():
        expected = torch.log_softmax(reference(input_ids=ids[None], mm_encoder_outputs=outputs).logits[0], dim=-1)
        got = ours.read_logprobs(ours(ids, attrs.evolve(AttentionPlan.for_sequence(60), media=(rows, image))))
    assert (got.double() - expected).abs().max().item() <= 1e-4


@pytest.fixture(scope="module")
def tiny_engine(folder):
    """The engine on the small model, under the name the shared scoring and extraction tests ask for."""
    return Engine(str(folder), device="cpu")


@pytest.mark.parametrize("name", list(CHOSEN))
def test_the_engines_answers_match_the_oracle(tiny_engine, folder, name):
    check_scores(tiny_engine.score(CHOSEN[name]), CHOSEN[name], Oracle(folder))


# a question's numbers do not depend on what shares its pass (tests/engine/test_independence.py, on this model)
alone = independence.alone
test_each_question_alone_equals_all_together = independence.test_each_question_alone_equals_all_together
test_with_300_other_questions = independence.test_with_300_other_questions
test_with_other_inputs_and_in_another_order = independence.test_with_other_inputs_and_in_another_order


def test_when_another_request_shares_the_passes(tiny_engine, alone):
    """A checkpoint served by path never shares passes between calls (api spec §9.6), so the pass is shared here
    through a loop that may."""
    loop = tiny_engine.new_loop(share_passes=True, floor_cache=0)
    mine = Call(independence.body(independence.TARGETS, [("a", independence.CONTENT)]), "scr_mine")
    others = independence.other_questions(80)
    other = Call(independence.body(others, [("b", independence.CONTENT[:200]), ("c", "Nothing.")]), "scr_other")
    loop.run([mine, other])
    assert loop.statistics().passes == 1 and other.unwrap()["results"]
    independence.assert_same(independence.numbers(mine.unwrap()), alone)


def test_when_the_input_is_split_into_pieces(folder, alone):
    small = Engine(str(folder), device="cpu", token_budget=384, max_tokens=1024)
    response = small.score(
        independence.body(independence.other_questions(60) + independence.TARGETS, [("a", independence.CONTENT)])
    )
    independence.assert_same(independence.numbers(response), alone)


# extraction decodes from the keys every layer kept, a shared layer's too (tests/engine/extraction)
ref = decode_exact.ref
test_greedy_generation_equals_the_reference_token_for_token = (
    decode_exact.test_greedy_generation_equals_the_reference_token_for_token
)
test_a_long_generated_path_is_bit_identical_at_every_depth = (
    decode_exact.test_a_long_generated_path_is_bit_identical_at_every_depth
)


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


# ``spinf-serve serve FOLDER`` answers /v1/score with the engine's numbers (a real server process)
test_serving_the_folder_answers_score = gemma31b.test_serving_the_folder_answers_score
