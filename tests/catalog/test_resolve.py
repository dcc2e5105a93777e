"""Tests of model resolution (api spec §9.6): manifest names in any case, local folders, Hub repo ids, and the
error for a name that is none of these."""

from __future__ import annotations

import logging
import re

import pytest

from spinf.catalog import DEFAULT_MODEL, load_catalog, resolve_model
from spinf.errors import ModelError

from .hub import GEMMA_CONFIG, LLAMA_CONFIG, QWEN_CONFIG, write_checkpoint


@pytest.mark.parametrize(
    ("name", "served"),
    [
        ("spinf/gemma-4-12b-fp8", "spinf/gemma-4-12b-fp8"),
        ("SPINF/Gemma-4-12B-FP8", "spinf/gemma-4-12b-fp8"),
        ("spinf-12b", "spinf/gemma-4-12b-fp8"),
        ("Google/Gemma-4-12b", "spinf/gemma-4-12b-fp8"),
        ("GEMMA-4-31B", "spinf/gemma-4-31b-fp8"),
        ("Qwen3.8-27B-S", "spinf/qwen3.8-27b-int4"),
        ("spinf/PPLX-decider-v1-27b-int4", "spinf/pplx-decider-v1-27b-int4"),
        ("TINY", "spinf/tiny-gemma4"),
    ],
)
def test_manifest_id_or_alias_in_any_case(name, served):
    resolved = resolve_model(name)
    assert resolved.served_name == served
    assert resolved.manifest == load_catalog().find(served)
    assert resolved.repo_id == resolved.manifest.source.repo
    assert resolved.revision == resolved.manifest.source.revision
    assert resolved.local_folder is None
    assert resolved.batch_invariant is True


@pytest.mark.parametrize("name", [None, ""])
def test_no_model_means_the_default_catalog_model_with_its_manifest(name):
    resolved = resolve_model(name)
    assert resolved.served_name == DEFAULT_MODEL == "spinf/gemma-4-12b-fp8"
    assert resolved.aliases == ["spinf-12b", "google/gemma-4-12B", "gemma-4-12b"]
    assert resolved.listing() == {
        "id": "spinf/gemma-4-12b-fp8",
        "name": "spinf Gemma 4 12B",
        "base_model": "spinf/gemma-4-12b-fp8",
        "aliases": ["spinf-12b", "google/gemma-4-12B", "gemma-4-12b"],
        "family": "gemma4",
        "capabilities": ["score", "extract", "generate"],
        "media": ["image", "audio", "video"],
        "image": {"detail_tokens": {"low": 70, "auto": 280, "high": 1120}},
    }


def test_engine_defaults_of_a_manifest():
    assert resolve_model("qwen3.8-27b-s").engine_defaults() == {
        "served_model": "spinf/qwen3.8-27b-int4",
        "model_id": "spinf/qwen3.8-27b-int4",
        "revision": "22de4859c04ccdb4136d89b66e56e717db752c7c",
        "quant": "",
        "media": ["image", "video"],
        "token_budget": 16384,
        "max_tokens": 16384,
    }
    decider = resolve_model("spinf/pplx-decider-v1-27b-int4")
    assert decider.engine_defaults()["media"] == []
    assert decider.capabilities == ["score"]
    assert decider.image is None
    assert "image" not in decider.listing()


def test_unknown_name_lists_the_catalog():
    with pytest.raises(ModelError, match=r"^unknown model 'gemma-12b': .*The catalog has: (.*)$") as caught:
        resolve_model("gemma-12b")
    listed = re.search(r"The catalog has: (.*)$", str(caught.value))[1].split(", ")
    assert {"spinf/gemma-4-12b-fp8", "spinf-12b", "google/gemma-4-12B", "tiny", "qwen3.8-27b-s"} <= set(listed)
    assert len(listed) == 13


@pytest.mark.parametrize(("config", "family"), [(GEMMA_CONFIG, "gemma4"), (QWEN_CONFIG, "qwen35")])
def test_local_folder_is_served_under_its_exact_name(tmp_path, config, family):
    folder = write_checkpoint(tmp_path / "My-Checkpoint", config=config)
    name = str(folder) + "/"
    resolved = resolve_model(name)
    assert resolved.served_name == name
    assert resolved.manifest is None
    assert resolved.local_folder == folder
    assert resolved.repo_id is None
    assert resolved.model_id == name
    assert resolved.revision is None
    assert resolved.family == family
    assert resolved.batch_invariant is False
    assert resolved.engine_defaults() == {}
    assert resolved.listing() == {
        "id": name,
        "name": name,
        "base_model": name,
        "aliases": [],
        "family": None,
        "capabilities": ["score", "extract", "generate"],
        "media": ["image", "audio", "video"],
    }


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text"])
def test_every_gemma4_model_type_is_gemma4(tmp_path, model_type):
    folder = write_checkpoint(tmp_path / "ckpt", config={"model_type": model_type})
    assert resolve_model(str(folder)).family == "gemma4"


def test_local_folder_of_another_architecture_is_refused(tmp_path):
    folder = write_checkpoint(tmp_path / "llama", config=LLAMA_CONFIG)
    with pytest.raises(ModelError, match=r"unsupported architecture \(model_type 'llama', architectures \['Llama"):
        resolve_model(str(folder))


def test_local_folder_without_config_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"is no checkpoint folder: it has no config.json$"):
        resolve_model(str(tmp_path / "empty"))


def test_a_manifest_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    write_checkpoint(tmp_path / "tiny", config=LLAMA_CONFIG)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("tiny").served_name == "spinf/tiny-gemma4"


def test_hub_repo_id_is_served_unpinned_and_resolving_it_logs_nothing(caplog):
    """The warning comes with the lookup (test_checkpoint), once: settings and start-up resolve the name again."""
    with caplog.at_level(logging.DEBUG):
        resolved = resolve_model("SomeOrg/Some-Model_v2.1")
    assert resolved.served_name == "SomeOrg/Some-Model_v2.1"
    assert resolved.repo_id == "SomeOrg/Some-Model_v2.1"
    assert (resolved.manifest, resolved.revision, resolved.local_folder, resolved.family) == (None, None, None, None)
    assert resolved.batch_invariant is False
    assert caplog.records == []


def test_a_planned_manifest_is_not_served(tmp_path):
    (tmp_path / "planned.toml").write_text(
        'id = "acme/next"\nname = "Next"\nstatus = "planned"\nfamily = "gemma4"\n'
        '[source]\nrepo = "acme/next"\nformat = "safetensors-bf16"\n'
    )
    catalog = load_catalog([tmp_path])
    with pytest.raises(ModelError, match=r"^model 'acme/next' is planned, not available yet"):
        resolve_model("ACME/next", catalog=catalog)
