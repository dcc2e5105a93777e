"""The tiny tokenizer both tiny twins ship (`spinf.engine.gemma4.tiny`, `spinf.engine.qwen35.tiny`): the packaged
``tokenizer.json`` (trained by contrib/train_tiny_tokenizer.py) and the small files written beside it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

_SPECIAL_TOKENS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
# No add_bos_token: the <bos> comes from the template in tokenizer.json, and the flag would make transformers
# rebuild that template its own way.
_TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    **_SPECIAL_TOKENS,
    "clean_up_tokenization_spaces": False,
    "model_max_length": 131072,
}


def json_bytes(value: Mapping[str, Any]) -> bytes:
    """A JSON file's bytes as the tiny snapshots write them (indented, one newline at the end)."""
    return (json.dumps(value, indent=2) + "\n").encode("utf-8")


def tokenizer_bytes() -> bytes:
    """The packaged tokenizer.json."""
    return (resources.files("spinf.catalog") / "tiny_gemma4" / "tokenizer.json").read_bytes()


def tokenizer_files() -> dict[str, bytes]:
    """The tiny tokenizer's files, by name."""
    return {
        "special_tokens_map.json": json_bytes(_SPECIAL_TOKENS),
        "tokenizer.json": tokenizer_bytes(),
        "tokenizer_config.json": json_bytes(_TOKENIZER_CONFIG),
    }
