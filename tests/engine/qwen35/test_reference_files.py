"""The Qwen3.5 stack's side files as spinf-serve 0.1.1 and the published checkpoints have them (issue 31): the outlier
table in the reference's format (fused names, ``n_out``, ``source``) in the folder or stored for the revision, and a
decider's decision_config.json and readout.safetensors with more than the engine reads. Each reads as the same
files in our format do, and a model runs bit for bit as it does on those."""

from __future__ import annotations

import json
import logging
import re
import shutil

import pytest
import torch

from spinf import Engine
from spinf.engine.folder import read_tensors
from spinf.engine.layout import build_pass
from spinf.engine.qwen35.int4 import int4_linears
from spinf.engine.qwen35.int4_write import write_gptq_checkpoint
from spinf.engine.qwen35.loading import load_for_engine
from spinf.engine.qwen35.model import load_qwen35
from spinf.engine.qwen35.outliers import OUTLIERS_FILE, read_outliers, table_paths
from spinf.engine.qwen35.readout import read_readout
from spinf.engine.qwen35.tiny import TINY_TEXT_CONFIG, write_tiny_decider, write_tiny_qwen35
from spinf.engine.scorer import one_cpu_thread
from spinf.engine.trie import Job, add_prompt
from spinf.errors import ModelError
from tests.engine.qwen35.reference_files import (
    add_published_decider_keys,
    reference_outliers,
    rewrite_outliers_as_reference,
)

CHANNELS = 8  # per norm-fed linear (hidden size 64)
GDN_IN, ATTENTION_QKV = "layers.0.linear_attn.in_proj_qkvz", "layers.2.self_attn.qkv_proj"  # the reference's names
HIDDEN, VOCAB = TINY_TEXT_CONFIG["hidden_size"], TINY_TEXT_CONFIG["vocab_size"]


@pytest.fixture(scope="module")
def int4(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference-int4")
    return write_gptq_checkpoint(write_tiny_qwen35(root / "float"), root / "int4", outlier_channels=CHANNELS)


@pytest.fixture
def reference(int4, tmp_path):
    """A copy of the int4 folder whose outlier table is the same channels in the reference's format."""
    folder = tmp_path / "reference"
    shutil.copytree(int4, folder)
    rewrite_outliers_as_reference(folder)
    return folder


def i8_logprobs(folder, table) -> torch.Tensor:
    tokens = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    job = Job(tuple(tokens[:30]))
    for k in range(3):
        add_prompt(job, tuple(tokens[30 + 3 * k : 33 + 3 * k]), [(5,)])
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        model = load_qwen35(folder, linear=int4_linears(read_tensors(folder, ""), "i8", table))
        return model.pass_logprobs(build_pass([job]))


def test_the_references_table_gives_our_tables_channels_and_bits(int4, reference):
    ours, theirs = read_outliers(int4), read_outliers(reference)
    assert json.loads((reference / OUTLIERS_FILE).read_text())["outliers"][GDN_IN]  # really the reference's keys
    assert theirs == ours and len(theirs) == 12
    assert torch.equal(i8_logprobs(reference, theirs), i8_logprobs(int4, ours))


def test_the_channels_decide_the_bits(int4, reference):
    """The check above can fail: the GDN input's channels given to gate/up and back move the scores."""
    path = reference / OUTLIERS_FILE
    table = json.loads(path.read_text())
    outliers = table["outliers"]
    gate_up = "layers.0.mlp.gate_up_proj"
    outliers[GDN_IN], outliers[gate_up] = outliers[gate_up], outliers[GDN_IN]
    assert outliers[GDN_IN] != outliers[gate_up]
    path.write_text(json.dumps(table))
    assert not torch.equal(i8_logprobs(reference, read_outliers(reference)), i8_logprobs(int4, read_outliers(int4)))


def test_what_the_model_does_not_need_is_ignored_and_logged_once(int4, reference, caplog):
    path = reference / OUTLIERS_FILE
    table = json.loads(path.read_text())
    table["calibration"] = {"stream": "ragtruth-8k", "dtype": "bfloat16"}
    table["outliers"] |= {"layers.6.mlp.gate_up_proj": [1, 2], "layers.0.mlp.down_proj": [3]}  # no such linear here
    del table["n_out"]  # optional: the reference reads the lists
    path.write_text(json.dumps(table))
    with caplog.at_level(logging.INFO, logger="spinf.engine.qwen35.outliers"):
        assert read_outliers(reference) == read_outliers(int4)
        assert read_outliers(reference) == read_outliers(int4)
    assert [record.getMessage() for record in caplog.records] == [
        f"{path}: ignoring keys this build does not read: calibration",
        f"{path}: ignoring entries for linears this model does not have: layers.0.mlp.down_proj, "
        "layers.6.mlp.gate_up_proj",
    ]


REFUSALS = {
    "an entry missing": (
        lambda t: t["outliers"].pop(ATTENTION_QKV),
        rf"no entry for {ATTENTION_QKV} in outliers \(spinf-serve 0.1.1's fused names, one per norm-fed linear of "
        r"the model: 12; 1 missing\)",
    ),
    "an attention layer keyed as a GDN": (
        lambda t: t["outliers"].update({"layers.2.linear_attn.in_proj_qkvz": t["outliers"].pop(ATTENTION_QKV)}),
        rf"no entry for {ATTENTION_QKV} in outliers .*",
    ),
    "a list off n_out": (
        lambda t: t["outliers"][GDN_IN].pop(),
        rf"outliers\['{GDN_IN}'\] has 7 channels, not n_out 8",
    ),
    "n_out off the lists": (lambda t: t.update(n_out=64), rf"outliers\['{GDN_IN}'\] has 8 channels, not n_out 64"),
    "n_out not an integer": (lambda t: t.update(n_out="64"), r"n_out '64' is not a positive integer"),
    "a channel repeated": (
        lambda t: t["outliers"][GDN_IN].__setitem__(1, t["outliers"][GDN_IN][0]),
        rf"outliers\['{GDN_IN}'\] repeats channel \d+",
    ),
    "a channel past the width": (
        lambda t: t["outliers"][GDN_IN].__setitem__(0, HIDDEN),
        rf"outliers\['{GDN_IN}'\] has a channel outside the input width {HIDDEN}",
    ),
    "per-channel maxima instead of indices": (
        lambda t: t["outliers"].update({GDN_IN: [0.5] * CHANNELS}),
        rf"outliers\['{GDN_IN}'\] is not a non-empty list of integers",
    ),
    "outliers not an object": (lambda t: t.update(outliers=[]), r"outliers is not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_real_inconsistency_is_a_model_error_naming_the_file(reference, case):
    edit, message = REFUSALS[case]
    path = reference / OUTLIERS_FILE
    table = json.loads(path.read_text())
    edit(table)
    path.write_text(json.dumps(table))
    with pytest.raises(ModelError, match=rf"^{re.escape(str(path))}: {message}$"):
        read_outliers(reference)


@pytest.fixture
def snapshot(int4, tmp_path, monkeypatch):
    """A copy of the int4 folder without its table, a store under a fresh HF_HOME, and no reference package."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))  # where a spinf_serve package goes when a test puts one
    folder = tmp_path / "rev1"  # a local folder's revision is its name (api spec §9.7)
    shutil.copytree(int4, folder)
    (folder / OUTLIERS_FILE).unlink()
    return folder


def test_the_revisions_table_is_looked_up_where_the_reference_keeps_them_in_order(int4, snapshot, tmp_path):
    store, package = tmp_path / "hf" / "spinf" / "scales", tmp_path / "site" / "spinf_serve"
    places = [
        store / "org--name" / "rev1-outliers.json",  # beside the fp8s table, rev1.json
        store / "tables" / "org__name" / "rev1-outliers.json",  # the reference's quant/tables copied to the store
        package / "quant" / "tables" / "org__name" / "rev1-outliers.json",  # the reference's own
    ]
    (package / "__init__.py").parent.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    assert table_paths(snapshot, "org/name", "rev1") == [snapshot / OUTLIERS_FILE, *places]
    assert read_outliers(snapshot, "org/name", "rev1") is None
    table = reference_outliers(json.loads((int4 / OUTLIERS_FILE).read_text()))
    for place in reversed(places):  # each one read, and each one before those after it
        place.parent.mkdir(parents=True)
        place.write_text(json.dumps(table))
        assert read_outliers(snapshot, "org/name", "rev1") == read_outliers(int4)
        if place != places[0]:
            place.write_text("{not json")  # no longer read once a place before it has a table
    assert read_outliers(snapshot) is None  # without the model id only the folder is asked
    assert read_outliers(snapshot, "org/name", "other") is None
    shutil.copyfile(int4 / OUTLIERS_FILE, snapshot / OUTLIERS_FILE)
    places[0].write_text("{not json")  # the folder's table comes first
    assert read_outliers(snapshot, "org/name", "rev1") == read_outliers(int4)


def test_the_engine_runs_i8_with_the_stores_table_and_names_the_places_without_one(int4, snapshot, tmp_path):
    with pytest.raises(ModelError) as refused:
        load_for_engine(snapshot, scheme="int4-i8", device="cpu", weight_format="gptq-int4-g32", model_id="org/name")
    store = tmp_path / "hf" / "spinf" / "scales"
    assert str(refused.value) == (
        f"the int4 i8 mode needs the checkpoint's outlier table, and there is none (looked at "
        f"{snapshot / OUTLIERS_FILE}, {store}/org--name/unpinned-outliers.json, "
        f"{store}/tables/org__name/unpinned-outliers.json; engine spec B.14.3): add the table, or run another mode "
        "(f16, fp8, bf16)"
    )
    path = store / "org--name" / "rev1-outliers.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(reference_outliers(json.loads((int4 / OUTLIERS_FILE).read_text()))))
    body = {
        "messages": [{"role": "user", "content": "I was charged twice for one order."}],
        "scoring": {"queries": [{"id": "q", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}]},
    }
    engine = Engine(str(snapshot), device="cpu", model_id="org/name")
    assert engine.quant == "int4-i8"
    assert engine.score(body)["results"] == Engine(str(int4), device="cpu").score(body)["results"]


@pytest.fixture(scope="module")
def decider(tmp_path_factory):
    return write_tiny_decider(tmp_path_factory.mktemp("reference-decider") / "decider")


def test_the_published_deciders_extra_keys_and_tensors_are_ignored_and_logged_once(decider, tmp_path, caplog):
    folder = tmp_path / "published"
    shutil.copytree(decider, folder)
    add_published_decider_keys(folder)
    config = json.loads((folder / "decision_config.json").read_text())
    assert len(config["codes"]) == 255 and config["codes"][:2] == [" yes", " no"]
    with caplog.at_level(logging.INFO, logger="spinf.engine.qwen35.readout"):
        got = read_readout(folder, hidden_size=HIDDEN, vocab_size=VOCAB)
        read_readout(folder, hidden_size=HIDDEN, vocab_size=VOCAB)
    expected = read_readout(decider, hidden_size=HIDDEN, vocab_size=VOCAB)
    assert torch.equal(got.matrix, expected.matrix)
    assert (got.token_ids, got.temperature) == (expected.token_ids, expected.temperature)
    assert [record.getMessage() for record in caplog.records] == [
        f"{folder / 'decision_config.json'}: ignoring keys this build does not read: codes, fit",
        f"{folder / 'readout.safetensors'}: ignoring tensors this build does not read: bias",
    ]
