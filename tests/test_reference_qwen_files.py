"""A real server on the Qwen3.5 stack with the side files a deployment of spinf-serve 0.1.1 already has (issue 31):
the outlier table in the reference's format shipped in the folder or stored for the checkpoint's revision, and the
published decider's decision_config.json and readout.safetensors with more than the engine reads.

Each server starts in the default int4-i8 mode and answers, bit for bit, as the engine does in-process on the same
weights with the files in our format (tests/engine/qwen35/test_reference_files.py checks the readers alone).
"""

from __future__ import annotations

import json
import shutil

import pytest
from spinf_client import SpinfClient, query, text

from contrib.loadtest.harness import ServerProcess, tiny_cache
from spinf.engine.qwen35.int4_write import write_gptq_checkpoint
from spinf.engine.qwen35.outliers import OUTLIERS_FILE
from spinf.engine.qwen35.tiny import write_tiny_decider, write_tiny_qwen35
from tests.engine.qwen35.reference_files import (
    add_published_decider_keys,
    reference_outliers,
    rewrite_outliers_as_reference,
)

QUERIES = [
    query("refund", "\n\nDoes the customer ask for a refund? Answer:{?}", [" yes", " no"]),
    query("angry", "\n\nIs the customer angry? Answer:{?}", [" yes", " no"]),
]
CONTENT = "I was charged twice for one order. Please refund one payment."
REPO = "someone/tiny-qwen35-gptq"  # the checkpoint repo a deployment names with SPINF_MODEL_ID


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("reference-qwen")


@pytest.fixture(scope="module")
def int4_folders(root):
    """The tiny model and the tiny decider in int4 with our files: what the engine runs in-process for comparison."""
    plain = write_gptq_checkpoint(write_tiny_qwen35(root / "float"), root / "int4", outlier_channels=4)
    decider = write_gptq_checkpoint(write_tiny_decider(root / "decider"), root / "int4-decider", outlier_channels=4)
    return plain, decider


def scores(folder) -> list:
    """The engine's results in-process on ``folder`` for the body the servers get."""
    from spinf import Engine

    body = {"messages": [{"role": "user", "content": [text(CONTENT)]}], "scoring": {"queries": QUERIES}}
    return Engine(str(folder), device="cpu").score(body)["results"]


def test_the_revisions_table_in_the_references_format_from_the_store(root, int4_folders):
    """The folder ships no table; the deployment's table for this revision sits in the store, in the reference's
    format (fused names, n_out, source), as the reference keeps its per-revision tables."""
    plain = int4_folders[0]
    folder = root / "rev-0a1b2c"  # a local folder's revision is its name (api spec §9.7)
    shutil.copytree(plain, folder)
    (folder / OUTLIERS_FILE).unlink()
    hf_home = tiny_cache(root / "hf")
    stored = hf_home / "spinf" / "scales" / REPO.replace("/", "--") / f"{folder.name}-outliers.json"
    stored.parent.mkdir(parents=True)
    stored.write_text(json.dumps(reference_outliers(json.loads((plain / OUTLIERS_FILE).read_text()))))
    process = ServerProcess(root / "server-store", model=str(folder), hf_home=hf_home, env={"SPINF_MODEL_ID": REPO})
    try:
        response = SpinfClient(base_url=process.url, model=str(folder)).score(content=[text(CONTENT)], queries=QUERIES)
    finally:
        assert process.stop() == 0
    assert "int4-i8" in process.output()
    assert response["results"] == scores(plain)


def test_the_published_decider_with_the_references_files_in_its_folder(root, int4_folders):
    """The int4 decider as published: the reference's outlier table in the folder, decision_config.json with
    ``codes`` and more, readout.safetensors with a second tensor. The extras are said once in the log."""
    decider = int4_folders[1]
    folder = root / "published-decider"
    shutil.copytree(decider, folder)
    rewrite_outliers_as_reference(folder, calibration={"tokens": 8192})
    add_published_decider_keys(folder)
    process = ServerProcess(root / "server-decider", model=str(folder))
    try:
        client = SpinfClient(base_url=process.url, model=str(folder))
        response = client.score(content=[text(CONTENT)], queries=QUERIES)
    finally:
        assert process.stop() == 0
    output = process.output()
    assert "int4-i8" in output
    assert response["results"] == scores(decider)
    for ignored in (
        f"{folder / OUTLIERS_FILE}: ignoring keys this build does not read: calibration",
        f"{folder / 'decision_config.json'}: ignoring keys this build does not read: codes, fit",
        f"{folder / 'readout.safetensors'}: ignoring tensors this build does not read: bias",
    ):
        assert output.count(ignored) == 1, ignored
