"""The Qwen3.5 hybrid decoder on packed tries against transformers' forward of each prompt alone, and bit-for-bit
per-question invariance on the CPU (engine spec B.14.2, C.1)."""

from __future__ import annotations

import json

import attrs
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

from spinf.engine.layout import build_pass
from spinf.engine.qwen35 import chunked
from spinf.engine.qwen35.config import FULL, LINEAR, parse_qwen35_config, read_qwen35_config
from spinf.engine.qwen35.model import load_qwen35
from spinf.engine.qwen35.plan import pass_plan
from spinf.engine.qwen35.tiny import TINY_TEXT_CONFIG, write_tiny_qwen35
from spinf.engine.scorer import one_cpu_thread
from spinf.engine.trie import Job, add_prompt
from spinf.errors import ModelError

TOLERANCE = 1e-4  # fp32 rounding: our token-by-token recurrence against transformers' chunked one


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_qwen35(tmp_path_factory.mktemp("tiny-qwen35"))


@pytest.fixture(scope="module")
def models(folder):
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    return load_qwen35(folder), reference.eval()


@pytest.fixture(autouse=True)
def _one_thread():
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        yield


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple(torch.randint(3, 8192, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


def job_of(
    prefix: tuple[int, ...], branches: list[tuple[int, ...]], fixed: int | None = None
) -> tuple[Job, list[tuple[int, int]]]:
    """A job whose prompts are ``branches``, each read (token 5) at its end: the job and each prompt's read. Its
    first ``fixed`` prefix rows (default: all) are fixed, as the compiler makes a content's: run chunked when at
    least 64."""
    job = Job(prefix, fixed=len(prefix) if fixed is None else fixed)
    return job, [add_prompt(job, branch, [(5,)])[0][0] for branch in branches]


def prompt_logprobs(model, jobs: list[tuple[Job, list[tuple[int, int]]]]) -> list[list[torch.Tensor]]:
    """One pass of ``jobs``: per job, each prompt's full next-token log-probs at its end."""
    layout = build_pass([job for job, _ in jobs])
    rows = model.pass_logprobs(layout)
    return [[rows[layout.read_index[(j, *read)][0]] for read in reads] for j, (_, reads) in enumerate(jobs)]


def reference_logprobs(reference, sequence: tuple[int, ...]) -> torch.Tensor:
    return torch.log_softmax(reference(torch.tensor([sequence])).logits[0, -1].float(), dim=-1)


def forked(seed: int, prefix_len: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """A prefix and prompts sharing stems, with forks at several depths, a prompt ending inside another one and an
    empty prompt (read at the prefix's end)."""
    stem, other = tokens(seed + 1, 6), tokens(seed + 2, 3)
    branches = [
        stem + tokens(seed + 3, 4),
        stem + tokens(seed + 4, 1),
        stem[:2] + tokens(seed + 5, 7),
        stem[:4],
        stem + tokens(seed + 3, 4)[:2] + tokens(seed + 6, 3),
        other,
        other + tokens(seed + 7, 2),
        (),
    ]
    return tokens(seed, prefix_len), branches


def test_the_tiny_checkpoint_loads_in_transformers_with_every_key(folder):
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    cfg, prefix = read_qwen35_config(folder)
    assert prefix == "model.language_model." and type(model).__name__ == "Qwen3_5ForCausalLM"
    assert cfg.layer_types.count(LINEAR) == 4 and cfg.layer_types.count(FULL) == 2 and not cfg.tie_word_embeddings
    assert (cfg.rotary_dim, cfg.conv_dim, cfg.vocab_size) == (8, 128, TINY_TEXT_CONFIG["vocab_size"])
    ours = load_qwen35(folder)
    assert torch.equal(ours.layers[0].mixer.A_log, model.model.layers[0].linear_attn.A_log)


@pytest.mark.parametrize(
    "case",
    [
        "one prompt",
        "forks",
        "long content",
        "long content, token by token",
        "long content, part of it fixed, in pieces",
        "a fixed prefix of one chunk",
        "deep branch",
        "no prefix",
    ],
)
def test_every_prompt_matches_transformers_alone(models, case, monkeypatch):
    ours, reference = models
    fixed = None
    if case == "long content, token by token":
        fixed = 0
    elif case == "long content, part of it fixed, in pieces":
        fixed = 250  # chunked in pieces of 128 (two full ones and a short one), then 50 rows token by token
        monkeypatch.setattr(chunked, "PIECE_TOKENS", 128)
    prefix, branches = {
        "one prompt": (tokens(1, 20), [tokens(2, 6)]),
        "forks": forked(10, 30),
        "long content": forked(20, 300),
        "long content, token by token": forked(20, 300),
        "long content, part of it fixed, in pieces": forked(20, 300),
        "a fixed prefix of one chunk": forked(25, 64),
        "deep branch": (tokens(30, 90), [tokens(31, 80), tokens(31, 80)[:70] + tokens(32, 5)]),
        "no prefix": ((), [tokens(40, 5), tokens(40, 5)[:2] + tokens(41, 3)]),
    }[case]
    (got,) = prompt_logprobs(ours, [job_of(prefix, branches, fixed)])
    for branch, row in zip(branches, got, strict=True):
        expected = reference_logprobs(reference, prefix + branch)
        assert (row - expected).abs().max().item() <= TOLERANCE, (case, branch)


def test_a_prompts_logprobs_are_the_same_bits_alone_among_siblings_and_among_other_jobs(models, monkeypatch):
    ours, _ = models
    monkeypatch.setattr(chunked, "PIECE_TOKENS", 128)  # the 140-row prefix in two pieces, sharing calls or not
    prefix, branches = forked(50, 140)
    branches = [b for b in branches if b]  # a job of the empty prompt alone would read at a prefix of no branches
    alone = [prompt_logprobs(ours, [job_of(prefix, [branch])])[0][0] for branch in branches]
    (together,) = prompt_logprobs(ours, [job_of(prefix, branches)])
    reordered = branches[::-1]
    others = [job_of(*forked(60, 100)), job_of(tokens(70, 7), [tokens(71, 3)])]
    mixed = prompt_logprobs(ours, [others[0], job_of(prefix, reordered), others[1]])[1][::-1]
    for branch, solo, sibling, packed in zip(branches, alone, together, mixed, strict=True):
        assert torch.equal(solo, sibling), branch
        assert torch.equal(solo, packed), branch


def test_segments_start_at_forks_and_read_their_parents_final_state():
    prefix, branches = (7, 8, 9), [(1, 2, 3), (1, 2, 4), (1, 5), (6,)]
    job, _ = job_of(prefix, branches)
    layout = build_pass([job_of((3, 4), [(5,)])[0], job])
    plan = pass_plan(layout, kernel=4)
    # rows: job 0 = 0..2 (one segment); job 1 = prefix 3..5, then 1@6, 2@7, 3@8, 4@9, 5@10, 6@11
    # (each of the nodes 9, 1 and 2 has two children, so a segment ends at each of them)
    expected = ((0, 3, -1), (3, 6, -1), (6, 7, 1), (7, 8, 2), (8, 9, 3), (9, 10, 3), (10, 11, 2), (11, 12, 1))
    assert plan.segments == expected and plan.kept == frozenset({1, 2, 3})
    # the convolution of token 5 (row 10) reads 9 (row 5), 1 (row 6), itself; of row 3 only itself (+1: zero row)
    assert plan.taps[10].tolist() == [5, 6, 7, 11] and plan.taps[3].tolist() == [0, 0, 0, 4]


@pytest.mark.parametrize("raw", [{}, TINY_TEXT_CONFIG], ids=["defaults", "tiny"])
def test_the_config_reads_what_transformers_reads(raw):
    theirs = Qwen3_5TextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    ours = parse_qwen35_config(raw)
    rope = theirs.rope_parameters
    assert ours.layer_types == tuple(theirs.layer_types)
    assert ours.rotary_dim == int(theirs.head_dim * rope["partial_rotary_factor"])
    assert ours.rope_theta == rope["rope_theta"]
    for name in ("vocab_size", "hidden_size", "intermediate_size", "head_dim", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(ours, name) == getattr(theirs, name), name
    for name in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel_dim"):
        assert getattr(ours, f"linear_{name}") == getattr(theirs, f"linear_{name}"), name
    assert (ours.num_heads, ours.num_kv_heads) == (theirs.num_attention_heads, theirs.num_key_value_heads)


def test_the_config_refuses_what_the_decoder_does_not_run(tmp_path):
    with pytest.raises(ModelError, match=r"^Qwen3.5 attention with biases \(attention_bias\) is not supported$"):
        parse_qwen35_config({"attention_bias": True})
    with pytest.raises(ModelError, match=r"layer_types"):
        parse_qwen35_config({"num_hidden_layers": 2, "layer_types": ["linear_attention", "sliding_attention"]})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe"}))
    with pytest.raises(ModelError, match=r"is not a Qwen3.5 model"):
        read_qwen35_config(tmp_path)


def test_three_d_rotary_positions_match_transformers(models):
    """An image's positions (engine spec A.14.3): its tokens share the start's t and add their row and column on h
    and w, and every token after it is shifted back by N - max(rows, cols). Given those positions, the decoder
    equals transformers' forward with the same position ids [3, 1, N] (its interleaved sections) to 1e-4, and
    differs from the plain 1-D positions (so the axes are really read)."""
    ours, reference = models
    before, rows, cols, after = 5, 3, 4, 9
    sequence = tokens(80, before + rows * cols + after)
    t, h, w = list(range(before)), list(range(before)), list(range(before))
    for r in range(rows):
        for c in range(cols):
            t.append(before)
            h.append(before + r)
            w.append(before + c)
    resume = before + max(rows, cols)  # the first position after the image
    for i in range(after):
        t.append(resume + i)
        h.append(resume + i)
        w.append(resume + i)
    positions = torch.tensor([t, h, w])  # [3, N]
    job, _ = job_of(sequence[:-1], [sequence[-1:]])
    layout = build_pass([job])
    plan = attrs.evolve(ours.plan(layout), positions3=positions.t().contiguous())
    hidden = ours(torch.tensor(layout.token_ids), plan)
    got = ours.read_logprobs(hidden[torch.tensor(layout.read_rows)])[0]
    logits = reference(torch.tensor([sequence]), position_ids=positions[:, None, :]).logits[0, -1].float()
    assert (got - torch.log_softmax(logits, dim=-1)).abs().max().item() <= TOLERANCE
    plain = ours.pass_logprobs(layout)[0]
    assert (got - plain).abs().max().item() > 1e-3
