"""The decider's readout head (engine spec A.15): its log-probs against a masked softmax computed here in float64,
all mass on the codes, bit-for-bit row invariance, every refusal of its two files, and the tiny decider."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from spinf.engine.layout import build_pass
from spinf.engine.qwen35.model import load_qwen35
from spinf.engine.qwen35.ops import rms_norm
from spinf.engine.qwen35.readout import (
    DECISION_CONFIG_FILE,
    READOUT_FILE,
    has_readout,
    read_readout,
    write_readout,
)
from spinf.engine.qwen35.tiny import TINY_TEXT_CONFIG, write_tiny_decider, write_tiny_qwen35
from spinf.engine.scorer import one_cpu_thread
from spinf.engine.tokenizer import TextTokenizer
from spinf.engine.trie import Job, add_prompt
from spinf.errors import ModelError

HIDDEN, VOCAB = TINY_TEXT_CONFIG["hidden_size"], TINY_TEXT_CONFIG["vocab_size"]
NUM_ROWS = 41  # one row alone, and among 40 others


@pytest.fixture(scope="module")
def decider(tmp_path_factory) -> Path:
    return write_tiny_decider(tmp_path_factory.mktemp("tiny-decider"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    return write_tiny_qwen35(tmp_path_factory.mktemp("tiny-qwen35"))


@pytest.fixture(autouse=True)
def _one_thread():
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        yield


@pytest.fixture(scope="module")
def normed_rows(plain) -> torch.Tensor:
    """Final-normed hidden states [NUM_ROWS, hidden] at the ends of prompts sharing a prefix, from the plain tiny
    checkpoint: the decider's decoder has the same tensors (`test_the_tiny_decider_is_the_tiny_checkpoint_...`)."""
    with torch.inference_mode():
        model = load_qwen35(plain)
        generator = torch.Generator().manual_seed(3)
        job = Job(tuple(torch.randint(3, VOCAB, (12,), generator=generator).tolist()))
        for _ in range(NUM_ROWS):
            add_prompt(job, tuple(torch.randint(3, VOCAB, (3,), generator=generator).tolist()), [(5,)])
        layout = build_pass([job])
        hidden = model(torch.tensor(layout.token_ids, dtype=torch.long), model.plan(layout))
        rows = hidden[torch.tensor(layout.read_rows, dtype=torch.long)]
        assert rows.shape == (NUM_ROWS, HIDDEN)
        return rms_norm(rows, model.final_norm, model.cfg.rms_norm_eps)


def decision_config(folder: Path) -> dict:
    return json.loads((folder / DECISION_CONFIG_FILE).read_text())


def masked_softmax(folder: Path, x: torch.Tensor, token_ids: list[int]) -> torch.Tensor:
    """The decider's own softmax over ``token_ids`` in float64, from the files as written (not through `Readout`)."""
    config = decision_config(folder)
    matrix = load_file(str(folder / READOUT_FILE))["weight"].double()
    rows = [config["token_ids"].index(token_id) for token_id in token_ids]
    logits = x.double() @ matrix[rows].T / config["temperature"]
    return torch.softmax(logits, dim=-1)


@pytest.mark.parametrize("options", [(" yes", " no"), ("A", "B", "C", "D", "E"), ("7", " the", " no", "x")])
def test_options_renormalised_are_the_deciders_masked_softmax(decider, normed_rows, options):
    tokenizer = TextTokenizer.from_folder(decider)
    token_ids = [tokenizer.tok(option)[0] for option in options]
    readout = read_readout(decider, hidden_size=HIDDEN, vocab_size=VOCAB)
    logprobs = readout.logprobs(normed_rows)[:, token_ids].double()
    p = torch.softmax(logprobs, dim=-1)  # exp(lp) / Σ exp(lp) over the options (A.8.2)
    expected = masked_softmax(decider, normed_rows, token_ids)
    assert (p - expected).abs().max().item() <= 1e-6


def test_all_mass_lies_on_the_codes_and_is_far_from_flat(decider, normed_rows):
    readout = read_readout(decider, hidden_size=HIDDEN, vocab_size=VOCAB)
    logprobs = readout.logprobs(normed_rows)
    assert logprobs.shape == (NUM_ROWS, VOCAB) and logprobs.dtype == torch.float32
    off_codes = torch.ones(VOCAB, dtype=torch.bool)
    off_codes[list(readout.token_ids)] = False
    assert int(off_codes.sum()) == VOCAB - 255
    assert bool((logprobs[:, off_codes] == -math.inf).all())
    on_codes = logprobs[:, ~off_codes].double()
    assert bool(torch.isfinite(on_codes).all())
    assert (on_codes.exp().sum(-1) - 1).abs().max().item() <= 1e-6
    expected = masked_softmax(decider, normed_rows, list(readout.token_ids)).log()
    assert (logprobs[:, readout.token_index].double() - expected).abs().max().item() <= 1e-5
    # the seeded matrix's scale: the likeliest code takes far more than a flat 1/255
    assert on_codes.exp().max(-1).values.min().item() > 20 / 255


def test_a_rows_logprobs_are_the_same_bits_alone_and_among_40_others(decider, normed_rows):
    readout = read_readout(decider, hidden_size=HIDDEN, vocab_size=VOCAB)
    together = readout.logprobs(normed_rows)
    reversed_rows = readout.logprobs(normed_rows.flip(0)).flip(0)
    for i in range(NUM_ROWS):
        alone = readout.logprobs(normed_rows[i : i + 1])[0]
        assert torch.equal(alone, together[i]), i
        assert torch.equal(alone, reversed_rows[i]), i


def test_the_readout_moves_to_a_device(decider):
    readout = read_readout(decider, hidden_size=HIDDEN, vocab_size=VOCAB)
    moved = readout.to("meta")
    assert moved.matrix.device.type == "meta" and moved.token_index.device.type == "meta"
    assert moved.token_ids == readout.token_ids and readout.matrix.device.type == "cpu"


def test_reading_gives_what_was_written(tmp_path):
    write_readout(tmp_path, hidden_size=HIDDEN, token_ids=[9, 4, 100], temperature=1.5, seed=7)
    readout = read_readout(tmp_path, hidden_size=HIDDEN, vocab_size=VOCAB)
    assert readout.token_ids == (9, 4, 100) and readout.token_index.tolist() == [9, 4, 100]
    assert readout.token_index.dtype == torch.long and readout.temperature == 1.5
    assert readout.matrix.dtype == torch.float32 and readout.matrix.shape == (3, HIDDEN)
    assert torch.equal(readout.matrix, load_file(str(tmp_path / READOUT_FILE))["weight"])


def test_the_tiny_decider_is_the_tiny_checkpoint_without_its_lm_head(decider, plain):
    ours, theirs = load_file(str(decider / "model.safetensors")), load_file(str(plain / "model.safetensors"))
    assert "lm_head.weight" not in ours and "lm_head.weight" in theirs
    assert set(ours) == set(theirs) - {"lm_head.weight"}
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    config = decision_config(decider)
    assert config["format_version"] == 1 and config["temperature"] == 0.7 and len(config["token_ids"]) == 255
    assert has_readout(decider) and not has_readout(plain)


def test_the_tiny_decider_is_written_with_the_same_bytes_every_time(decider, tmp_path):
    again = write_tiny_decider(tmp_path / "again")
    names = sorted(p.name for p in decider.iterdir())
    assert names == sorted(p.name for p in again.iterdir()) and READOUT_FILE in names and DECISION_CONFIG_FILE in names
    for name in names:
        assert (decider / name).read_bytes() == (again / name).read_bytes(), name


def test_the_tiny_deciders_codes_are_single_tokens_of_plain_strings(decider):
    tokenizer = TextTokenizer.from_folder(decider)
    token_ids = decision_config(decider)["token_ids"]
    assert len(set(token_ids)) == 255
    texts = [tokenizer.decode([token_id]) for token_id in token_ids]
    assert texts[:2] == [" yes", " no"]
    for token_id, text in zip(token_ids, texts, strict=True):
        assert re.fullmatch(r"[0-9A-Za-z]| [a-z]{1,6}", text), (token_id, text)
        assert tokenizer.tok(text) == (token_id,), (token_id, text)


def test_has_readout_sees_either_file(tmp_path):
    assert not has_readout(tmp_path)
    (tmp_path / DECISION_CONFIG_FILE).write_text("{}")
    assert has_readout(tmp_path)
    (tmp_path / DECISION_CONFIG_FILE).unlink()
    (tmp_path / READOUT_FILE).write_bytes(b"")
    assert has_readout(tmp_path)


def _config(**changes):
    """Rewrites the good folder's config: the keys given replace (a value of ``...``: remove) the written ones."""

    def apply(folder: Path) -> None:
        config = decision_config(folder)
        for key, value in changes.items():
            if value is ...:
                del config[key]
            else:
                config[key] = value
        (folder / DECISION_CONFIG_FILE).write_text(json.dumps(config))

    return apply


def _config_text(text: str):
    return lambda folder: (folder / DECISION_CONFIG_FILE).write_text(text)


def _tensors(**tensors):
    return lambda folder: save_file(tensors, str(folder / READOUT_FILE))


def _unlink(name: str):
    return lambda folder: (folder / name).unlink()


_GOOD = torch.ones((3, HIDDEN))
_NAN = _GOOD.clone()
_NAN[1, 5] = math.nan
_NAN[2, 0] = math.inf
C, R = "{config}", "{readout}"  # replaced by the files' escaped paths
CONFIG_NAME, READOUT_NAME = re.escape(DECISION_CONFIG_FILE), re.escape(READOUT_FILE)
REFUSALS = {
    "no readout file": (
        _unlink(READOUT_FILE),
        rf"^{R}: missing \(a readout head needs {CONFIG_NAME} and {READOUT_NAME}\)$",
    ),
    "no config file": (_unlink(DECISION_CONFIG_FILE), rf"^{C}: missing \(a readout head needs .*\)$"),
    "config not JSON": (_config_text("{"), rf"^{C}: not readable JSON \(.*\)$"),
    "NaN temperature": (  # Python's json reads NaN, as the reference's loader does: the check refuses it
        _config_text('{"format_version": 1, "token_ids": [10, 11, 12], "temperature": NaN}'),
        rf"^{C}: temperature is nan; it must be finite and above 0$",
    ),
    "config not an object": (_config_text("[1]"), rf"^{C}: not a JSON object$"),
    "missing key": (_config(temperature=...), rf"^{C}: missing key 'temperature'$"),
    "version 2": (_config(format_version=2), rf"^{C}: format_version is 2; only 1 is supported$"),
    "version true": (_config(format_version=True), rf"^{C}: format_version is True; only 1 is supported$"),
    "no ids": (_config(token_ids=[]), rf"^{C}: token_ids must be a non-empty list of token ids$"),
    "ids not a list": (_config(token_ids=5), rf"^{C}: token_ids must be a non-empty list of token ids$"),
    "id not an integer": (_config(token_ids=[10, "11", 12]), rf"^{C}: token_ids\[1\] is '11', not an integer$"),
    "id a float": (_config(token_ids=[10, 11, 12.0]), rf"^{C}: token_ids\[2\] is 12.0, not an integer$"),
    "id past the vocabulary": (
        _config(token_ids=[10, VOCAB, 12]),
        rf"^{C}: token_ids\[1\] is 8192, outside the vocabulary \[0, 8192\)$",
    ),
    "negative id": (_config(token_ids=[-1, 11, 12]), rf"^{C}: token_ids\[0\] is -1, outside the vocabulary .*$"),
    "ids repeat": (_config(token_ids=[10, 11, 10]), rf"^{C}: token_ids\[2\] repeats 10 \(first at token_ids\[0\]\)$"),
    "temperature 0": (_config(temperature=0), rf"^{C}: temperature is 0; it must be finite and above 0$"),
    "negative temperature": (_config(temperature=-0.5), rf"^{C}: temperature is -0.5; it must be finite and above 0$"),
    "infinite temperature": (  # JSON has no infinity, but Python's json reads 1e999 as one
        _config_text('{"format_version": 1, "token_ids": [10, 11, 12], "temperature": 1e999}'),
        rf"^{C}: temperature is inf; it must be finite and above 0$",
    ),
    "temperature a string": (_config(temperature="0.7"), rf"^{C}: temperature is '0.7', not a number$"),
    "temperature true": (_config(temperature=True), rf"^{C}: temperature is True, not a number$"),
    "more ids than rows": (
        _config(token_ids=[10, 11, 12, 13]),
        rf"^{R}: weight has 3 rows but {CONFIG_NAME} lists 4 token_ids \(one row per code\)$",
    ),
    "non-finite entries": (
        _tensors(weight=_NAN),
        rf"^{R}: weight has 2 non-finite entries \(the first at row 1, column 5\)$",
    ),
    "another name": (_tensors(R=_GOOD), rf"^{R}: holds the tensors \['R'\]; a readout's matrix is 'weight'$"),
    "a vector": (
        _tensors(weight=torch.ones(HIDDEN)),
        rf"^{R}: weight is a 1-D torch.float32 tensor; a readout is .*$",
    ),
    "integers": (
        _tensors(weight=torch.ones((3, HIDDEN), dtype=torch.int32)),
        rf"^{R}: weight is a 2-D torch.int32 tensor; a readout is a 2-D float matrix \[codes, hidden\]$",
    ),
    "not safetensors": (
        lambda folder: (folder / READOUT_FILE).write_bytes(b"\x01\x02garbage"),
        rf"^{R}: not a readable safetensors file \(.*\)$",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_problem_with_the_files_is_a_model_error_naming_the_file(tmp_path, case):
    write_readout(tmp_path, hidden_size=HIDDEN, token_ids=[10, 11, 12], temperature=0.7)
    read_readout(tmp_path, hidden_size=HIDDEN, vocab_size=VOCAB)  # the folder is good before the change
    change, pattern = REFUSALS[case]
    change(tmp_path)
    paths = {C: re.escape(str(tmp_path / DECISION_CONFIG_FILE)), R: re.escape(str(tmp_path / READOUT_FILE))}
    pattern = pattern.replace(C, paths[C]).replace(R, paths[R])
    with pytest.raises(ModelError, match=pattern):
        read_readout(tmp_path, hidden_size=HIDDEN, vocab_size=VOCAB)


def test_a_readout_narrower_than_the_model_is_refused(tmp_path):
    write_readout(tmp_path, hidden_size=HIDDEN, token_ids=[10, 11, 12], temperature=0.7)
    path = re.escape(str(tmp_path / READOUT_FILE))
    with pytest.raises(ModelError, match=rf"^{path}: weight is 64 wide; the model is 96$"):
        read_readout(tmp_path, hidden_size=96, vocab_size=VOCAB)
