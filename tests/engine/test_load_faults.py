"""Load faults: a damaged shard or shard index is one `ModelError` line naming the file and what is wrong, from the
engine (through the catalog's completeness check) and from the loader itself, which a folder can reach unchecked
(benchmarks load one directly) or changed since the check."""

from __future__ import annotations

import json
import shutil

import pytest

from spinf import Engine
from spinf.engine.loading import load_gemma4_text
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
