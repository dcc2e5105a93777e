"""Load faults: a damaged shard or shard index is one `ModelError` line naming the file and what is wrong, from the
engine (through the catalog's completeness check) and from the loader itself, which a folder can reach unchecked
(benchmarks load one directly) or changed since the check."""

from __future__ import annotations

import json
import shutil

import pytest

from spinf import Engine
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.errors import ModelError

from ..catalog.hub import rewrite_header

DTYPE_ERROR = "Error while deserializing header: invalid JSON in header: unknown variant `Q32`"


@pytest.fixture
def damaged(tiny_engine, tmp_path):
    """A copy of the tiny checkpoint whose shard header names a dtype safetensors does not know."""
    folder = tmp_path / "damaged"
    shutil.copytree(tiny_engine.folder, folder)
    rewrite_header(folder / "model.safetensors", "model.language_model.embed_tokens.weight", dtype="Q32")
    return folder


def test_the_loader_names_a_shard_that_safetensors_refuses(damaged):
    with pytest.raises(ModelError) as refused:
        load_gemma4_text(damaged)
    message = str(refused.value)
    assert message.startswith(f"{damaged / 'model.safetensors'}: not a readable safetensors file ({DTYPE_ERROR}")
    assert "\n" not in message


def test_the_loader_names_a_shard_index_it_cannot_read(tiny_engine, tmp_path):
    folder = tmp_path / "indexed"
    shutil.copytree(tiny_engine.folder, folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ModelError, match=r"model\.safetensors\.index\.json: not a readable shard index \(KeyError: "):
        load_gemma4_text(folder)


def test_an_engine_on_a_damaged_model_dir_is_refused_in_one_line_naming_the_shard(damaged, tiny_cache):
    with pytest.raises(ModelError) as refused:
        Engine("tiny", device="cpu", model_dir=str(damaged), cache_dir=tiny_cache)
    message = str(refused.value)
    assert message.startswith(
        f"checkpoint folder {damaged} is incomplete or damaged: model.safetensors: not a valid safetensors file "
        f"({DTYPE_ERROR}"
    )
    assert "\n" not in message


def _broken(config: dict, case: str) -> str:
    text = dict(config["text_config"])
    if case == "truncated":
        return json.dumps(config)[:60]
    if case == "a list":
        return "[1, 2]"
    if case == "a key missing":
        del text["hidden_size"]
    elif case == "a size of the wrong type":
        text["hidden_size"] = "abc"
    elif case == "text_config a list":
        return json.dumps({**config, "text_config": [1]})
    return json.dumps({**config, "text_config": text})


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("truncated", "cannot read {path}: Unterminated string"),
        ("a list", "{path} is not a JSON object"),
        ("a key missing", "{path}: the key 'hidden_size' is missing"),
        ("a size of the wrong type", "{path}: hidden_size must be a positive integer, not 'abc'"),
        ("text_config a list", "{path}: text_config is not an object"),
    ],
)
def test_a_broken_config_json_is_refused_naming_the_file(tiny_engine, tmp_path, case, says):
    """Regression (issue 33 item 8): a config.json that parsed but held a wrong shape was reported as a bare
    ``KeyError: 'hidden_size'``, a torch ``TypeError`` or an ``AttributeError``, naming no file."""
    folder = tmp_path / "broken"
    shutil.copytree(tiny_engine.folder, folder)
    path = folder / "config.json"
    path.write_text(_broken(json.loads(path.read_text()), case))
    with pytest.raises(ModelError) as refused:
        Engine(str(folder), device="cpu")
    assert str(refused.value).startswith(says.format(path=path))
