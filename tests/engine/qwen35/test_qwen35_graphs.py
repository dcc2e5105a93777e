"""The pieces the Qwen3.5 stack's CUDA graphs hold (`spinf.engine.qwen35.graphs`), run eagerly on the CPU: a pass cut
at every recurrence, with each piece's results kept in the shared buffers, gives the forward's bits. The GPU test
(tests/engine/qwen35/test_gpu_qwen35_graphs.py) replays the captured pieces against eager passes."""

from __future__ import annotations

import pytest
import torch

from spinf.engine.layout import build_pass
from spinf.engine.qwen35.graphs import Static, recurrent_layers, run_pieces
from spinf.engine.qwen35.model import load_qwen35
from spinf.engine.qwen35.tiny import write_tiny_qwen35
from spinf.engine.scorer import one_cpu_thread
from spinf.engine.trie import Job, add_prompt
from tests.engine.qwen35.test_qwen35_model import tokens


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_qwen35(write_tiny_qwen35(tmp_path_factory.mktemp("tiny-qwen35")))


def test_the_pieces_are_cut_at_every_recurrent_layer(model):
    kinds = [layer.is_attention for layer in model.layers]
    assert recurrent_layers(model) == tuple(i for i, attention in enumerate(kinds) if not attention)
    assert any(kinds) and not all(kinds)  # the tiny model has both kinds, so pieces hold attention layers too


@pytest.mark.parametrize("prefix_len", [12, 90])  # token by token; a fixed prefix run chunked
def test_the_pieces_run_eagerly_give_the_forwards_bits(model, prefix_len):
    jobs = []
    for seed in (1, 2):
        job = Job(tokens(seed, prefix_len), fixed=prefix_len)
        for branch in (tokens(seed + 10, 5), tokens(seed + 10, 3) + tokens(seed + 20, 4), tokens(seed + 30, 2)):
            add_prompt(job, branch, [(5,)])
        jobs.append(job)
    layout = build_pass(jobs)
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        plan = model.plan(layout)
        token_ids = torch.tensor(layout.token_ids, dtype=torch.long)
        expected = model(token_ids, plan)
        rows = layout.num_tokens
        arena: dict[str, torch.Tensor] = {}
        static = Static(rows, token_ids, plan, arena, capacity=rows + 7)  # views of larger buffers, as a bucket's
        got = run_pieces(model, static, plan)
    assert torch.equal(got, expected)
    assert arena["h"].shape[0] == rows + 7
    assert {"q", "k", "v", "g", "beta", "decay", "z", "o", "cos", "sin", "projected"} <= set(arena)
    # z is a view of the input projection's buffer (its last columns), kept without a copy
    assert arena["z"].untyped_storage().data_ptr() == arena["projected"].data_ptr()
    assert arena["z"].shape[0] == rows + 7 and arena["z"].stride() == arena["projected"].stride()


def test_a_value_a_kernel_wrote_into_a_buffer_is_kept_without_a_copy():
    tokens_ = torch.zeros(5, dtype=torch.long)
    arena: dict[str, torch.Tensor] = {}
    static = Static(5, tokens_, None, arena, capacity=8)
    mixed = static.place("mixed", (5, 12), torch.float32)
    mixed.copy_(torch.arange(60.0).view(5, 12))
    v = mixed[:, 4:].view(5, 2, 4)  # a kernel's output, then a view of its last columns (gdn_inputs' v)
    kept = static.keep("v", v)
    assert kept.data_ptr() == v.data_ptr() and torch.equal(kept, v)
    assert arena["v"].shape == (8, 2, 4) and arena["v"].untyped_storage().data_ptr() == arena["mixed"].data_ptr()
    other = torch.ones(5, 3)  # made elsewhere: copied into a buffer of its own
    assert static.keep("z", other).data_ptr() == arena["z"].data_ptr() != other.data_ptr()
    with pytest.raises(ValueError, match="rows"):
        static.place("q", (6, 12), torch.float32)
    with pytest.raises(ValueError, match="asked for"):
        static.place("mixed", (5, 13), torch.float32)
