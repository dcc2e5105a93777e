"""Tiny Qwen3.5 text checkpoints written by transformers itself: ``Qwen3_5TextConfig`` with its own defaults (no
``mrope_section``, the default ``partial_rotary_factor`` 0.25 and ``rope_theta``, ``layer_types`` from
``full_attention_interval``) apart from the sizes, a ``Qwen3_5ForCausalLM`` initialised by transformers, and
``save_pretrained``: the files a user gets from transformers, not from our tiny twin's writer
(`spinf.engine.qwen35.tiny`). The tokenizer is the tiny Gemma's, as the twin's.

Every width is a multiple of 128 (hidden 128, GDN value width 128, attention 4 × 32), so GPTQ groups of 32, 64,
128 and whole rows all divide every linear's input. ``initializer_range`` 0.1 instead of 0.02 makes next-token
distributions far from flat (the log-probs spread over about 9 nats), so rotary or layer mistakes show.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from spinf.engine.tiny_tokenizer import tokenizer_files
from tests.engine.oracle import Oracle
from tests.engine.test_oracle import check_combination, chosen_queries

SIZES = {
    "vocab_size": 8192,  # the tiny Gemma tokenizer's
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 8,  # two full-attention layers (3 and 7), six Gated DeltaNets
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # 8 rotary dims (4 pairs) at transformers' default factor 0.25
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "initializer_range": 0.1,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
}


def write_transformers_qwen35(folder: str | Path, seed: int = 0, **overrides) -> Path:
    """``Qwen3_5ForCausalLM`` of `SIZES` (``overrides`` on top) saved by transformers into ``folder``, with the tiny
    Gemma tokenizer; the folder."""
    folder = Path(folder)
    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(**(SIZES | overrides))
    Qwen3_5ForCausalLM(config).save_pretrained(folder)
    for name, data in tokenizer_files().items():
        (folder / name).write_bytes(data)
    return folder


def oracle_of(folder: Path) -> Oracle:
    """`Oracle` (transformers' forward of each prompt alone) with the folder's tokenizer.json as it is: transformers
    would rebuild a Qwen3.5 tokenizer around it from the model type (its own pre-tokenizer)."""
    reading = Oracle(folder)
    reading.hf_tok = PreTrainedTokenizerFast.from_pretrained(folder)
    reading.bos = reading.hf_tok("", add_special_tokens=True).input_ids
    return reading


def check_scores(response: dict, body: dict, oracle: Oracle) -> None:
    """Every combination of a text-only ``body``'s ``response`` equals ``oracle``'s reading (`check_combination`:
    log-probs within 1e-4)."""
    for inp, result in zip(body["inputs"], response["results"], strict=True):
        wanted = chosen_queries(body, inp)
        expected = oracle.score_input(inp["messages"][0]["content"][0]["text"], wanted, body["scoring"])
        assert [q["id"] for q in result["queries"]] == [q["id"] for q in wanted]
        for got_query, combos in zip(result["queries"], expected, strict=True):
            for got, (main, floor) in zip(got_query["combinations"], combos, strict=True):
                check_combination(got, main, floor)
