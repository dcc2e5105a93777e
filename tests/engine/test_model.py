"""The engine's own Gemma 4 modules against transformers' definitions, and the CPU GEMM row rule."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from spinf.engine.attention import AttentionPlan, JobSpan
from spinf.engine.config import read_text_config
from spinf.engine.model import MIN_GEMM_ROWS, load_gemma4_text, row_stable_mm


def sequence_plan(n: int) -> AttentionPlan:
    empty = torch.zeros(0, 1, dtype=torch.long)
    return AttentionPlan(
        positions=torch.arange(n),
        jobs=(JobSpan(0, n, 0),),
        branch_rows=torch.zeros(0, dtype=torch.long),
        path_index=empty,
        path_mask=empty.bool(),
    )


@pytest.fixture(scope="module")
def models(tiny_engine):
    reference = AutoModelForCausalLM.from_pretrained(tiny_engine.folder, attn_implementation="eager")
    return load_gemma4_text(tiny_engine.folder), reference.eval()


def test_the_tiny_config_has_the_real_models_features(tiny_engine):
    cfg, prefix = read_text_config(tiny_engine.folder)
    sliding = [spec for spec in cfg.layers if spec.is_sliding]
    full = [spec for spec in cfg.layers if not spec.is_sliding]
    assert prefix == "model." and cfg.sliding_window == 32 and cfg.final_logit_softcapping == 30.0
    assert {(s.head_dim, s.num_kv_heads, s.k_eq_v) for s in sliding} == {(32, 2, False)}
    assert {(s.head_dim, s.num_kv_heads, s.k_eq_v, s.rope_fraction) for s in full} == {(64, 1, True, 0.25)}


@pytest.mark.parametrize("length", [1, 31, 33, 200])
def test_one_sequence_matches_transformers(models, length):
    ours, reference = models
    ids = torch.randint(3, 8192, (length,), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        expected = torch.log_softmax(reference(ids[None]).logits[0].float(), dim=-1)
        got = ours.read_logprobs(ours(ids, sequence_plan(length)))
    assert (got - expected).abs().max().item() <= 1e-5


def test_gemm_rows_do_not_depend_on_the_row_count():
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(256, 64, generator=gen), torch.randn(300, 64, generator=gen)
    full = row_stable_mm(x, weight)
    for rows in [1, 2, 3, 5, 7, 9, MIN_GEMM_ROWS, 17, 100]:
        for offset in [0, 3, 128]:
            assert torch.equal(row_stable_mm(x[offset : offset + rows], weight), full[offset : offset + rows])
