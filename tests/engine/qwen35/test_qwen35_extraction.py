"""Extraction and generation on the Qwen3.5 stack (engine spec B.14.4) against the same independent transformers
reading as the Gemma stack's (tests/engine/extraction/test_decode_exact.py, whose tests run here on the tiny twin):
greedy generation token for token, the beam's answers and probabilities, seeded sampling draw for draw, and a
decoded token with the bits of the same path scored as a branch.

The twin carries the tiny Gemma's tokenizer.json; transformers would rebuild a Qwen3.5 tokenizer around it from the
model type (its own pre-tokenizer), so the reference reads tokenizer.json as it is, like the engine."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from spinf import Engine
from spinf.engine.layout import build_pass
from spinf.engine.qwen35.tiny import write_tiny_qwen35
from spinf.engine.scorer import one_cpu_thread
from spinf.engine.trie import Job, add_prompt
from tests.engine.extraction import reference as reference_module
from tests.engine.extraction.probe import only, outcomes
from tests.engine.extraction.reference import Reference
from tests.engine.extraction.test_decode_exact import (  # noqa: F401 - collected here, on the Qwen twin
    ORDER,
    REFUND,
    Steps,
    one_query,
    split,
    test_a_generated_token_has_the_bits_of_the_same_path_scored,
    test_a_searched_path_has_the_bits_of_the_same_path_scored,
    test_greedy_generation_equals_the_reference_token_for_token,
    test_seeded_sampling_equals_the_reference_draw_for_draw,
    test_the_beam_equals_an_independent_search,
    test_the_first_step_distribution_is_the_scoring_pass_row,
)


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    """The Qwen3.5 twin's engine, under the name the imported tests use."""
    return Engine(str(write_tiny_qwen35(tmp_path_factory.mktemp("tiny-qwen35"))), device="cpu")


@pytest.fixture(scope="module")
def ref(tiny_engine):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reference_module, "AutoTokenizer", PreTrainedTokenizerFast)
        return Reference(tiny_engine.folder)


LONG_PATHS = [(REFUND, "\n\nSummary:{*}"), (ORDER, '\n\nName: "{*}"')]


def check_a_long_generated_path(engine: Engine, monkeypatch, content: str, template: str) -> None:
    """Every step of a 64-token generation against the same path scored as a branch: one pass of the model over
    the input's job whose branches are the template followed by the first m generated tokens, for every m at
    once, its head read in the scorer's fixed chunks (`full_logprobs`). Each decode step runs the recurrence again
    from the prefix state over the template and every token so far; it gets, bit for bit, the log-prob the scoring
    pass reads at that path's end. (On a GPU, with the decode's CUDA graphs off: `Steps` records eager steps.)"""
    gen = {"id": "g", "template": template, "generate": True, "max_tokens": 64}
    monkeypatch.setattr(engine.extractor, "full_length", True)  # nothing ends before 64 tokens
    monkeypatch.setattr(engine.extractor, "graphs", False)
    with outcomes(engine.loop) as found:
        steps = Steps(monkeypatch)
        engine.score(one_query(content, gen))
    [(tokens, _)] = only(found, "g")[0].sequences
    assert len(tokens) == 64
    tk = engine.tokenizer
    before = split(template)[0]
    assert tk.tok(content + before) == tk.tok(content) + tk.tok(before)  # a clean join: no cut
    job = Job(tuple(tk.bos) + tk.tok(content))
    reads = [add_prompt(job, tk.tok(before) + tuple(tokens[:m]), [(tokens[m],)])[0][0] for m in range(64)]
    layout = build_pass([job])
    model, device = engine.model, engine.device
    with one_cpu_thread(device), torch.inference_mode():
        hidden = model(torch.tensor(layout.token_ids, dtype=torch.long, device=device), model.plan(layout))
        rows = model.full_logprobs(hidden[torch.tensor(layout.read_rows, dtype=torch.long, device=device)]).cpu()
    scored = [float(rows[layout.read_index[(0, *read)][0], tokens[m]]) for m, read in enumerate(reads)]
    assert [float(steps.generate[m][0][0, 0, tokens[m]]) for m in range(64)] == scored


@pytest.mark.parametrize(("content", "template"), LONG_PATHS)
def test_a_long_generated_path_replays_its_recurrence_to_the_same_bits(tiny_engine, monkeypatch, content, template):
    check_a_long_generated_path(tiny_engine, monkeypatch, content, template)


def test_a_recurrent_layer_captures_only_the_rows_its_decode_steps_read(tiny_engine):
    """Of each prefix a recurrent layer keeps its last ``kernel - 1`` rows (its convolution's reach; the state after
    the prefix stands for the rest) and every template row; an attention layer keeps every row. The budgets count
    a prefix row at the attention layers' bytes."""
    from spinf.engine.scorer import capture_plan

    long_job, short_job = Job(tuple(range(10, 50))), Job((7, 8))
    for job, templates in ((long_job, [(60, 61, 62), (60, 63)]), (short_job, [(64,)])):
        for template in templates:
            add_prompt(job, template, [], extracts=True)
    layout = build_pass([long_job, short_job])
    cost = tiny_engine.model.capture_cost()
    assert cost.tail == tiny_engine.model.cfg.linear_conv_kernel_dim - 1 == 3
    starts, capture = capture_plan(layout, torch.device("cpu"), cost.tail)
    rows = capture.rows.tolist()
    assert len(rows) == 40 + 4 + 2 + 1  # both prefixes, the long job's 4 template rows (60 shared), the short one's
    kept = [row for row, place in zip(rows, capture.compact, strict=True) if place >= 0]
    assert kept == capture.compact_rows.tolist() == rows[37:40] + rows[40:44] + rows[44:]
    assert [place for place in capture.compact if place >= 0] == list(range(len(kept)))
    model = tiny_engine.model
    attention = sum(layer.is_attention for layer in model.layers)
    per_row = 2 * model.cfg.num_kv_heads * model.cfg.head_dim * model.embed.element_size()
    assert cost.prefix_token == attention * per_row < cost.path_token
    assert cost.units(40, 4) == 40 + -(-4 * cost.path_token // cost.prefix_token) + -(
        -cost.per_prefix // cost.prefix_token
    )
