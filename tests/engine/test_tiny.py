"""Tests of the built-in tiny model: its snapshot loads with plain transformers and is generated deterministically.

Everything is generated into temporary cache folders; nothing touches the network or the user's hub cache.
"""

from __future__ import annotations

import json
import threading
from importlib import resources
from itertools import pairwise
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer

from spinf.catalog import resolve_model
from spinf.engine.gemma4.tiny import (
    SNAPSHOT_CONFIG,
    TEXT_PREFIX,
    TINY_CONFIG,
    TINY_REVISION,
    ensure_tiny_snapshot,
    find_or_generate,
    snapshot_weight_shapes,
    tiny_state_dict,
)

VOCAB_SIZE = 8192
SPECIAL_IDS = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<start_of_turn>": 4,
    "<end_of_turn>": 5,
    "<start_of_image>": 6,
    "<end_of_image>": 7,
    "<image_soft_token>": 8,
    "<start_of_audio>": 9,
    "<end_of_audio>": 10,
    "<audio_soft_token>": 11,
}
SINGLE_TOKEN_WORDS = [" yes", " no", " Yes", " No", " true", " false", " positive", " negative", "Yes", "yes"]
SNAPSHOT_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_snapshot(tmp_path_factory.mktemp("hub"))


@pytest.fixture(scope="module")
def model(snapshot: Path) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(snapshot).eval()


@pytest.fixture(scope="module")
def tokenizer(snapshot: Path) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(snapshot)


@pytest.fixture(scope="module")
def raw_tokenizer(snapshot: Path) -> Tokenizer:
    return Tokenizer.from_file(str(snapshot / "tokenizer.json"))


def test_snapshot_has_the_hub_cache_layout(tmp_path: Path) -> None:
    folder = ensure_tiny_snapshot(tmp_path)
    repo = tmp_path / "models--spinf--tiny-gemma4"
    assert folder == repo / "snapshots" / TINY_REVISION
    assert (repo / "refs" / "main").read_text() == TINY_REVISION
    assert {path.name for path in folder.iterdir()} == SNAPSHOT_FILES
    assert [path.name for path in repo.iterdir() if path.name.startswith(".")] == []
    assert len(TINY_REVISION) == 40 and int(TINY_REVISION, 16) >= 0


def test_the_engine_generates_the_snapshot_where_the_catalog_says_then_finds_it(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file-root"
    not_a_folder.write_text("")
    tiny = resolve_model("tiny")
    lookup = {"cache_dirs": [str(not_a_folder), str(tmp_path / "cache")], "hf_home": str(tmp_path / "hf")}
    first = find_or_generate(tiny, **lookup)
    assert first.folder == tmp_path / "cache" / "models--spinf--tiny-gemma4" / "snapshots" / TINY_REVISION
    assert (first.revision, first.weights, first.family) == (TINY_REVISION, "generated", "gemma4")
    again = find_or_generate(tiny, **lookup)
    assert (again.folder, again.weights) == (first.folder, str(tmp_path / "cache"))


def test_config_and_tokenizer_files(snapshot: Path) -> None:
    assert json.loads((snapshot / "config.json").read_text()) == SNAPSHOT_CONFIG
    generation = json.loads((snapshot / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    packaged = resources.files("spinf.catalog") / "tiny_gemma4" / "tokenizer.json"
    assert (snapshot / "tokenizer.json").read_bytes() == packaged.read_bytes()


def test_model_loads_with_no_missing_or_unexpected_keys(snapshot: Path) -> None:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(snapshot, output_loading_info=True)
    assert type(model).__name__ == "Gemma4UnifiedForConditionalGeneration"  # the 12B's layout, media embedders too
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set() and info["error_msgs"] == []


def test_weight_shapes_match_transformers(snapshot: Path) -> None:
    config = transformers.AutoConfig.from_pretrained(snapshot)
    reference = transformers.AutoModelForCausalLM.from_config(config)
    assert reference.lm_head.weight is reference.model.language_model.embed_tokens.weight
    # The state dict lists the tied head too; a checkpoint stores that tensor once, under the embedding's name.
    expected = {key: tuple(tensor.shape) for key, tensor in reference.state_dict().items() if key != "lm_head.weight"}
    assert snapshot_weight_shapes() == expected
    with safe_open(snapshot / "model.safetensors", framework="pt") as weights:
        assert weights.metadata() == {"format": "pt"}
        stored = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}
        assert {weights.get_slice(key).get_dtype() for key in weights.keys()} == {"F32"}
    assert stored == expected
    assert "lm_head.weight" not in stored and TEXT_PREFIX + "layers.2.self_attn.v_proj.weight" not in stored
    assert {key for key in stored if not key.startswith(TEXT_PREFIX)} == {
        key for key in expected if key.startswith(("model.embed_vision.", "model.embed_audio."))
    }


def test_weights_follow_the_recipe(model: transformers.PreTrainedModel) -> None:
    weights = model.state_dict()
    for index in range(TINY_CONFIG["num_hidden_layers"]):
        assert weights[f"{TEXT_PREFIX}layers.{index}.layer_scalar"].tolist() == [1.0]
    embedding_std = weights[f"{TEXT_PREFIX}embed_tokens.weight"].std().item()
    assert 0.33 < embedding_std < 0.37
    assert abs(weights[f"{TEXT_PREFIX}norm.weight"].mean().item() - 1.0) < 0.1
    # the text weights are the text-only generator's (the media embedders draw from a stream of their own), so
    # recorded text scores carry over
    for key, value in tiny_state_dict().items():
        assert torch.equal(weights[TEXT_PREFIX + key.removeprefix("model.")], value), key


def test_generation_is_deterministic(tmp_path: Path) -> None:
    first = ensure_tiny_snapshot(tmp_path / "a")
    second = ensure_tiny_snapshot(tmp_path / "b")
    assert first.name == second.name == TINY_REVISION
    for name in SNAPSHOT_FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_existing_snapshot_is_reused_and_ref_repaired(tmp_path: Path) -> None:
    folder = ensure_tiny_snapshot(tmp_path)
    weights = folder / "model.safetensors"
    written = weights.stat().st_mtime_ns
    ref = tmp_path / "models--spinf--tiny-gemma4" / "refs" / "main"
    ref.write_text("0" * 40)
    assert ensure_tiny_snapshot(tmp_path) == folder
    assert weights.stat().st_mtime_ns == written
    assert ref.read_text() == TINY_REVISION


def test_concurrent_generation_yields_one_complete_snapshot(tmp_path: Path) -> None:
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_tiny_snapshot(tmp_path))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    repo = tmp_path / "models--spinf--tiny-gemma4"
    assert len(results) == 4 and set(results) == {repo / "snapshots" / TINY_REVISION}
    assert {path.name for path in results[0].iterdir()} == SNAPSHOT_FILES
    assert sorted(path.name for path in repo.iterdir()) == ["refs", "snapshots"]


def test_tokenizer_vocabulary_and_special_ids(tokenizer: transformers.PreTrainedTokenizerBase) -> None:
    assert len(tokenizer) == VOCAB_SIZE
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_IDS} == SPECIAL_IDS
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (2, 1)
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id) == (0, 3)
    assert tokenizer.model_max_length == 131072


def test_empty_text_encodes_to_bos(tokenizer: transformers.PreTrainedTokenizerBase, raw_tokenizer: Tokenizer) -> None:
    assert tokenizer("")["input_ids"] == [2]
    assert tokenizer("", add_special_tokens=False)["input_ids"] == []
    assert raw_tokenizer.encode("").ids == [2]
    assert raw_tokenizer.encode("", add_special_tokens=False).ids == []


@pytest.mark.parametrize("word", SINGLE_TOKEN_WORDS)
def test_answer_words_are_single_tokens(
    word: str, tokenizer: transformers.PreTrainedTokenizerBase, raw_tokenizer: Tokenizer
) -> None:
    assert len(raw_tokenizer.encode(word, add_special_tokens=False).ids) == 1
    assert len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1
    if word.startswith(" "):
        assert raw_tokenizer.encode(word, add_special_tokens=False).tokens == ["Ġ" + word[1:]]


def test_offsets_cut_the_text(raw_tokenizer: Tokenizer) -> None:
    text = "Is the review positive?  Answer: yes\n\tno."
    offsets = raw_tokenizer.encode(text, add_special_tokens=False).offsets
    assert "".join(text[start:end] for start, end in offsets) == text
    # Bytes of one character split over several tokens share its offsets; cutting at token ends still works.
    text = "naïve café — 日本 🙂"
    ends = [0] + [end for _, end in raw_tokenizer.encode(text, add_special_tokens=False).offsets]
    assert ends == sorted(ends) and "".join(text[a:b] for a, b in pairwise(ends)) == text


def test_special_token_text_in_user_input(raw_tokenizer: Tokenizer) -> None:
    # By default the literal text "<bos>" is matched as the special token; encode_special_tokens turns it into
    # ordinary text. The engine must use the latter for user content.
    assert 2 in raw_tokenizer.encode("a <bos> b", add_special_tokens=False).ids
    text_only = Tokenizer.from_str(raw_tokenizer.to_str())
    text_only.encode_special_tokens = True
    ids = text_only.encode("a <bos> b", add_special_tokens=False).ids
    assert not set(ids) & set(SPECIAL_IDS.values())
    assert text_only.decode(ids) == "a <bos> b"


def test_forward_pass_gives_peaked_capped_logits(
    model: transformers.PreTrainedModel, tokenizer: transformers.PreTrainedTokenizerBase
) -> None:
    inputs = tokenizer("The film was wonderful. Is the review positive? Answer:", return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], VOCAB_SIZE)
    assert torch.isfinite(logits).all() and logits.abs().max().item() <= 30.0
    assert logits[0, -1].softmax(-1).max().item() > 10 / VOCAB_SIZE
