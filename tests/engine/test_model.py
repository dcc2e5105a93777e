"""The engine's own Gemma 4 modules against transformers' definitions, and the CPU GEMM row rule."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from spinf.engine.attention import AttentionPlan
from spinf.engine.gemm import GEMM_ROWS, in_row_blocks, row_stable_mm
from spinf.engine.gemma4.config import read_text_config
from spinf.engine.gemma4.loading import load_gemma4_text


@pytest.fixture(scope="module")
def models(tiny_engine):
    reference = AutoModelForCausalLM.from_pretrained(tiny_engine.folder, attn_implementation="eager")
    return load_gemma4_text(tiny_engine.folder), reference.eval()


def test_the_tiny_config_has_the_real_models_features(tiny_engine):
    cfg, prefix = read_text_config(tiny_engine.folder)
    sliding = [spec for spec in cfg.layers if spec.is_sliding]
    full = [spec for spec in cfg.layers if not spec.is_sliding]
    assert prefix == "model.language_model." and cfg.sliding_window == 32 and cfg.final_logit_softcapping == 30.0
    assert {(s.head_dim, s.num_kv_heads, s.k_eq_v) for s in sliding} == {(32, 2, False)}
    assert {(s.head_dim, s.num_kv_heads, s.k_eq_v, s.rope_fraction) for s in full} == {(64, 1, True, 0.25)}


@pytest.mark.parametrize("length", [1, 31, 33, 200])
def test_one_sequence_matches_transformers(models, length):
    ours, reference = models
    ids = torch.randint(3, 8192, (length,), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        expected = torch.log_softmax(reference(ids[None]).logits[0].float(), dim=-1)
        got = ours.read_logprobs(ours(ids, AttentionPlan.for_sequence(length)))
    assert (got - expected).abs().max().item() <= 1e-4  # fp32 rounding differences, same as the oracle test


@pytest.mark.parametrize("threads", [1, 2, 16])
def test_gemm_rows_do_not_depend_on_the_row_count_or_position(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(threads)
        weight, x = torch.randn(256, 64, generator=gen), torch.randn(700, 64, generator=gen)
        full = row_stable_mm(x, weight)
        for rows in [1, 2, 3, 5, 7, 9, 16, 17, GEMM_ROWS + 1, 300]:
            for offset in [0, 3, 128, 333]:
                assert torch.equal(row_stable_mm(x[offset : offset + rows], weight), full[offset : offset + rows])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 24, 27])
def test_row_blocks_give_every_product_call_one_shape_and_copy_only_the_last_block(count):
    """`in_row_blocks` (the GPU's fixed-row-block products): every call gets exactly ``rows`` contiguous rows, the
    last block padded with zeros; the whole blocks are ``x``'s own rows (no copy of ``x``), even from a strided
    view, and the rows come back in order."""
    x = torch.arange(30 * 6, dtype=torch.float32).reshape(30, 6)[:count, ::2]  # a strided view
    seen = []

    def product(block: torch.Tensor) -> torch.Tensor:
        seen.append((tuple(block.shape), block.is_contiguous(), block.data_ptr()))
        return block * 2 + 1

    got = in_row_blocks(x, product, rows=8)
    assert torch.equal(got, x * 2 + 1)
    assert {shape for shape, _, _ in seen} == {(8, 3)} and all(contiguous for _, contiguous, _ in seen)
    assert len(seen) == max(1, -(-count // 8))
    dense = torch.arange(30 * 3, dtype=torch.float32).reshape(30, 3)[:count]
    seen.clear()
    assert torch.equal(in_row_blocks(dense, product, rows=8), dense * 2 + 1)
    whole = count // 8
    assert [ptr for _, _, ptr in seen[:whole]] == [dense[8 * b :].data_ptr() for b in range(whole)]


def test_both_serialisations_of_the_per_layer_overrides_give_the_same_config():
    from spinf.engine.gemma4.config import parse_text_config
    from spinf.engine.gemma4.tiny import TINY_CONFIG

    newer = {k: v for k, v in TINY_CONFIG.items() if k not in ("global_head_dim", "num_global_key_value_heads")}
    newer["per_layer_config"] = {
        "2": {"head_dim": 64, "num_key_value_heads": 1},
        "5": {"head_dim": 64, "num_key_value_heads": 1},
    }
    assert parse_text_config(newer) == parse_text_config(dict(TINY_CONFIG))
