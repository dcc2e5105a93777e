"""Tests of checkpoint lookup (api spec §9.7) on fake Hub caches: revision pinning, incomplete or damaged snapshots,
root order, local-dir folders, downloads (faked at the huggingface_hub boundary), the offline error and the tiny
model."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from spinf.catalog import (
    TinySnapshotMissing,
    describe_catalog,
    download_model,
    find_checkpoint,
    generated_checkpoint,
    resolve_model,
)
from spinf.catalog.snapshot import safetensors_problem, snapshot_problem
from spinf.errors import ModelError

from .hub import LLAMA_CONFIG, QWEN_CONFIG, rewrite_header, truncate, write_checkpoint, write_local_dir, write_snapshot

REPO = "spinf/gemma-4-12b-fp8"
PINNED = "a689df2c5f611e3bfaa4569b8190f97db5018569"
OTHER = "1111111111111111111111111111111111111111"


@pytest.fixture
def gemma():
    return resolve_model("spinf-12b")


@pytest.fixture
def no_download(monkeypatch):
    """Fails the test if anything tries to download."""

    def refuse(*args, **kwargs):
        raise AssertionError("snapshot_download must not be called")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


def lookup(resolved, roots, tmp_path, **kwargs):
    kwargs.setdefault("offline", True)
    return find_checkpoint(resolved, cache_dirs=[str(root) for root in roots], hf_home=str(tmp_path / "hf"), **kwargs)


def test_pinned_snapshot_in_a_cache_root(tmp_path, gemma, no_download):
    folder = write_snapshot(tmp_path / "cache", REPO, PINNED)
    checkpoint = lookup(gemma, [tmp_path / "cache"], tmp_path)
    assert checkpoint.folder == folder
    assert checkpoint.revision == PINNED
    assert checkpoint.weights == str(tmp_path / "cache")
    assert (checkpoint.family, checkpoint.weight_format) == ("gemma4", "fp8-static")
    assert checkpoint.num_bytes() == sum(path.stat().st_size for path in folder.glob("*.safetensors")) > 0


def test_another_revision_does_not_count_for_a_pinned_model(tmp_path, gemma, no_download):
    write_snapshot(tmp_path / "cache", REPO, OTHER)
    with pytest.raises(ModelError, match=rf"revision {OTHER}, not the pinned one"):
        lookup(gemma, [tmp_path / "cache"], tmp_path)


DAMAGES = [
    "no config",
    "missing shard",
    "truncated shard",
    "truncated header",
    "no weights",
    "bad dtype",
    "bad offsets",
]


@pytest.mark.parametrize("damage", DAMAGES)
def test_an_incomplete_snapshot_is_skipped_for_the_next_root(tmp_path, gemma, damage, no_download):
    broken = write_snapshot(tmp_path / "first", REPO, PINNED, index=damage != "no weights")
    shard = broken / "model-00002-of-00002.safetensors"
    if damage == "no config":
        (broken / "config.json").unlink()
    elif damage == "missing shard":
        shard.unlink()
    elif damage == "truncated shard":
        truncate(shard)
    elif damage == "truncated header":
        shard.write_bytes(shard.read_bytes()[:20])
    elif damage == "bad dtype":
        rewrite_header(shard, "layer2.weight", dtype="Q32")
    elif damage == "bad offsets":
        rewrite_header(shard, "layer2.weight", data_offsets=[0, 32])  # half the bytes its shape needs
    else:
        (broken / "model.safetensors").unlink()
    problem = snapshot_problem(broken)
    assert problem is not None
    if damage.startswith("bad "):  # whole files whose header lies: only safetensors' own check sees it
        assert problem.startswith("model-00002-of-00002.safetensors: not a valid safetensors file (Error while ")
    good = write_snapshot(tmp_path / "second", REPO, PINNED)
    checkpoint = lookup(gemma, [tmp_path / "first", tmp_path / "second"], tmp_path)
    assert checkpoint.folder == good
    assert checkpoint.weights == str(tmp_path / "second")


def test_incomplete_snapshots_are_named_in_the_error(tmp_path, gemma, no_download):
    broken = write_snapshot(tmp_path / "cache", REPO, PINNED)
    truncate(broken / "model-00001-of-00002.safetensors", 3)
    with pytest.raises(ModelError, match=r"Skipped: .*model-00001-of-00002.safetensors: truncated \("):
        lookup(gemma, [tmp_path / "cache"], tmp_path)


def test_cache_dirs_come_before_hf_home(tmp_path, monkeypatch, gemma, no_download):
    in_hf_home = write_snapshot(tmp_path / "hf" / "hub", REPO, PINNED)
    in_root = write_snapshot(tmp_path / "root-b", REPO, PINNED)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("SPINF_CACHE_DIRS", f"{tmp_path / 'root-a'}::{tmp_path / 'root-b'}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    checkpoint = find_checkpoint(gemma)
    assert (checkpoint.folder, checkpoint.weights) == (in_root, str(tmp_path / "root-b"))
    monkeypatch.delenv("SPINF_CACHE_DIRS")
    checkpoint = find_checkpoint(gemma)
    assert (checkpoint.folder, checkpoint.weights) == (in_hf_home, str(tmp_path / "hf" / "hub"))


def test_offline_with_nothing_cached_says_what_is_missing_and_the_three_ways(
    tmp_path, monkeypatch, gemma, no_download
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as caught:
        find_checkpoint(gemma, cache_dirs=[str(tmp_path / "cache")], hf_home=str(tmp_path / "hf"))
    message = str(caught.value)
    assert message.startswith(f"the checkpoint {REPO} at revision {PINNED} is not in any cache root (")
    assert str(tmp_path / "cache") in message and str(tmp_path / "hf" / "hub") in message
    assert "--model-dir FOLDER" in message
    assert "SPINF_CACHE_DIRS" in message
    assert "`spinf-serve download spinf/gemma-4-12b-fp8` on a machine with network" in message


def test_download_false_does_not_download(tmp_path, gemma, no_download):
    with pytest.raises(ModelError, match=r"downloads are off"):
        lookup(gemma, [], tmp_path, offline=False, download=False)


# -- hf download --local-dir folders ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["org--name", "org/name", "the root itself"])
def test_local_dir_folder_with_the_pinned_commit(tmp_path, gemma, layout, no_download):
    root = tmp_path / "models"
    folder = {"org--name": root / "spinf--gemma-4-12b-fp8", "org/name": root / "spinf" / "gemma-4-12b-fp8"}.get(
        layout, root
    )
    write_local_dir(folder, PINNED)
    checkpoint = lookup(gemma, [root], tmp_path)
    assert (checkpoint.folder, checkpoint.revision, checkpoint.weights) == (folder, PINNED, str(root))


def test_local_dir_folder_of_another_commit_is_skipped(tmp_path, gemma, no_download):
    write_local_dir(tmp_path / "models" / "spinf--gemma-4-12b-fp8", OTHER)
    with pytest.raises(ModelError, match=r"is not in any cache root"):
        lookup(gemma, [tmp_path / "models"], tmp_path)


def test_local_dir_folder_with_mixed_commits_has_no_revision(tmp_path, gemma, no_download):
    folder = write_local_dir(tmp_path / "models" / "spinf--gemma-4-12b-fp8", PINNED)
    (folder / ".cache/huggingface/download/config.json.metadata").write_text(f"{OTHER}\netag\n0\n")
    with pytest.raises(ModelError, match=r"is not in any cache root"):
        lookup(gemma, [tmp_path / "models"], tmp_path)


# -- folders given as they are ------------------------------------------------------------------------------------


def test_model_dir_is_used_as_it_is(tmp_path, gemma, no_download):
    folder = write_checkpoint(tmp_path / "my-weights", config=QWEN_CONFIG)
    checkpoint = lookup(gemma, [], tmp_path, model_dir=str(folder))
    # Served as the manifest's model: no revision check, the manifest's architecture.
    assert (checkpoint.folder, checkpoint.revision, checkpoint.weights) == (folder, "my-weights", "config")
    assert checkpoint.family == "gemma4"


def test_model_dir_revision_comes_from_local_dir_metadata(tmp_path, gemma, no_download):
    folder = write_local_dir(tmp_path / "my-weights", OTHER)
    assert lookup(gemma, [], tmp_path, model_dir=str(folder)).revision == OTHER


def test_an_incomplete_model_dir_is_refused(tmp_path, gemma):
    folder = write_checkpoint(tmp_path / "my-weights")
    (folder / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(ModelError, match=r"is incomplete or damaged: model-00001-of-00002.safetensors: missing$"):
        lookup(gemma, [], tmp_path, model_dir=str(folder))


def test_a_model_dir_whose_shard_header_safetensors_refuses_names_the_shard_and_why(tmp_path, gemma):
    folder = write_checkpoint(tmp_path / "my-weights")
    rewrite_header(folder / "model-00002-of-00002.safetensors", "layer2.weight", shape=[4, 5])
    with pytest.raises(ModelError) as refused:
        lookup(gemma, [], tmp_path, model_dir=str(folder))
    assert str(refused.value) == (
        f"checkpoint folder {folder} is incomplete or damaged: model-00002-of-00002.safetensors: not a valid "
        "safetensors file (Error while deserializing header: invalid shape, data type, or offset for tensor)"
    )


def test_a_local_folder_model_is_used_as_it_is(tmp_path, no_download):
    folder = write_checkpoint(tmp_path / "qwen-local", config=QWEN_CONFIG)
    checkpoint = lookup(resolve_model(str(folder)), [tmp_path / "unused"], tmp_path)
    assert (checkpoint.folder, checkpoint.revision, checkpoint.weights, checkpoint.family) == (
        folder,
        "qwen-local",
        "config",
        "qwen35",
    )


# -- unpinned Hub repos -------------------------------------------------------------------------------------------


def test_unpinned_repo_prefers_refs_main_and_detects_the_family(tmp_path, no_download, caplog):
    root = tmp_path / "cache"
    write_snapshot(root, "acme/qwen-ft", OTHER, config=QWEN_CONFIG)
    main = write_snapshot(root, "acme/qwen-ft", PINNED, config=QWEN_CONFIG)  # refs/main now points here
    os.utime(main, (0, 0))  # older than the other: refs/main still wins
    with caplog.at_level(logging.WARNING, logger="spinf.catalog.checkpoint"):
        checkpoint = lookup(resolve_model("acme/qwen-ft"), [root], tmp_path)
    assert (checkpoint.folder, checkpoint.revision, checkpoint.family) == (main, PINNED, "qwen35")
    assert checkpoint.weight_format == "safetensors-bf16"
    assert caplog.messages == [
        "acme/qwen-ft is not in the catalog: serving the Hub repo unpinned, without batch invariance"
    ]


def test_unpinned_repo_of_another_architecture_is_refused(tmp_path, no_download):
    write_snapshot(tmp_path / "cache", "acme/llama", OTHER, config=LLAMA_CONFIG)
    with pytest.raises(ModelError, match=r"unsupported architecture \(model_type 'llama'"):
        lookup(resolve_model("acme/llama"), [tmp_path / "cache"], tmp_path)


# -- downloads ----------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_hub(monkeypatch):
    """A fake ``snapshot_download`` that writes what the Hub would serve into the cache layout and records calls."""
    calls = []
    served = {"revision": None, "damage": None}  # None: the revision asked for (PINNED when unpinned)

    def snapshot_download(repo_id, *, revision=None, cache_dir=None, allow_patterns=None, token=None):
        calls.append(dict(repo_id=repo_id, revision=revision, cache_dir=cache_dir, allow=allow_patterns, token=token))
        folder = write_snapshot(Path(cache_dir), repo_id, served["revision"] or revision or PINNED)
        if served["damage"]:
            (folder / "config.json").unlink()
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls, served


def test_a_missing_snapshot_is_downloaded_into_hf_home(tmp_path, monkeypatch, gemma, fake_hub):
    calls, _ = fake_hub
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    checkpoint = lookup(gemma, [tmp_path / "cache"], tmp_path, offline=False)
    hub = tmp_path / "hf" / "hub"
    assert calls == [
        dict(
            repo_id=REPO,
            revision=PINNED,
            cache_dir=hub,
            allow=["*.json", "*.safetensors", "tokenizer*"],
            token="hf_secret",
        )
    ]
    assert checkpoint.folder == hub / "models--spinf--gemma-4-12b-fp8" / "snapshots" / PINNED
    assert (checkpoint.revision, checkpoint.weights) == (PINNED, "downloaded")


def test_a_download_of_the_wrong_revision_is_refused(tmp_path, gemma, fake_hub):
    fake_hub[1]["revision"] = OTHER
    with pytest.raises(ModelError, match=rf"^the download of {REPO} is revision {OTHER}, not the pinned {PINNED}$"):
        lookup(gemma, [], tmp_path, offline=False)


def test_an_incomplete_download_is_refused(tmp_path, gemma, fake_hub):
    fake_hub[1]["damage"] = True
    with pytest.raises(ModelError, match=r"is incomplete: no config.json$"):
        lookup(gemma, [], tmp_path, offline=False)


def test_an_unpinned_download_logs_a_warning(tmp_path, fake_hub, caplog):
    checkpoint = lookup(resolve_model("acme/gemma-ft"), [], tmp_path, offline=False)
    assert fake_hub[0][0]["revision"] is None
    assert (checkpoint.revision, checkpoint.weights) == (PINNED, "downloaded")
    assert "unpinned" in caplog.text


def test_a_failed_download_says_the_three_ways(tmp_path, monkeypatch, gemma):
    def unreachable(*args, **kwargs):
        raise LocalEntryNotFoundError("cannot reach the Hub and nothing cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(ModelError, match=r"(?s)the download failed \(LocalEntryNotFoundError: .*--model-dir FOLDER"):
        lookup(gemma, [], tmp_path, offline=False)


# -- the tiny model -----------------------------------------------------------------------------------------------


def test_a_missing_tiny_snapshot_is_reported_with_the_first_writable_root_then_found(tmp_path, no_download):
    """The catalog generates nothing (that takes torch): it says where the snapshot goes, and finds it there."""
    not_a_folder = tmp_path / "file-root"
    not_a_folder.write_text("")
    tiny = resolve_model("tiny")
    with pytest.raises(TinySnapshotMissing) as missing:
        lookup(tiny, [not_a_folder, tmp_path / "cache"], tmp_path)
    assert (missing.value.resolved, missing.value.root) == (tiny, tmp_path / "cache")
    assert str(missing.value) == (
        f"the built-in model spinf/tiny-gemma4 at revision {tiny.revision} is not generated yet; it goes in "
        f"{tmp_path / 'cache'}, written by the engine when it opens the model or by "
        "`spinf-serve download spinf/tiny-gemma4`"
    )
    folder = write_snapshot(tmp_path / "cache", "spinf/tiny-gemma4", tiny.revision)
    found = lookup(tiny, [not_a_folder, tmp_path / "cache"], tmp_path)
    assert (found.folder, found.revision, found.weights) == (folder, tiny.revision, str(tmp_path / "cache"))


def test_without_a_writable_root_the_tiny_model_is_an_ordinary_missing_model(tmp_path, no_download):
    not_a_folder = tmp_path / "file-root"
    not_a_folder.write_text("")
    with pytest.raises(ModelError, match=r"and no cache root is writable to generate it in\.\n") as refused:
        find_checkpoint(resolve_model("tiny"), cache_dirs=[str(not_a_folder)], hf_home=str(not_a_folder))
    assert not isinstance(refused.value, TinySnapshotMissing)


def test_a_generated_snapshot_is_checked_before_it_counts(tmp_path):
    tiny = resolve_model("tiny")
    folder = write_snapshot(tmp_path / "cache", "spinf/tiny-gemma4", tiny.revision)
    generated = generated_checkpoint(tiny, folder)
    assert (generated.folder, generated.revision, generated.weights) == (folder, tiny.revision, "generated")
    truncate(folder / "model-00002-of-00002.safetensors", 7)
    size = (folder / "model-00002-of-00002.safetensors").stat().st_size
    with pytest.raises(ModelError) as damaged:
        generated_checkpoint(tiny, folder)
    assert str(damaged.value) == (
        f"the tiny model's snapshot {folder} is damaged: model-00002-of-00002.safetensors: truncated ({size} bytes, "
        f"the header says {size + 7}); remove it to have it generated"
    )
    other = write_snapshot(tmp_path / "cache", "spinf/tiny-gemma4", OTHER)
    with pytest.raises(
        ModelError, match=rf"^the tiny model's generator writes revision {OTHER}, but its manifest pins"
    ):
        generated_checkpoint(tiny, other)


def test_download_model_into_a_given_root(tmp_path, fake_hub):
    with pytest.raises(TinySnapshotMissing) as missing:
        download_model("tiny", str(tmp_path / "dl"))
    assert missing.value.root == tmp_path / "dl"
    folder = download_model("qwen3.8-27b-s", str(tmp_path / "dl"))
    assert fake_hub[0][0]["cache_dir"] == tmp_path / "dl"
    assert folder.parent.parent.parent == tmp_path / "dl"


def test_download_model_of_a_local_folder_returns_it(tmp_path):
    folder = write_checkpoint(tmp_path / "ckpt")
    assert download_model(str(folder)) == folder


# -- spinf-serve models -------------------------------------------------------------------------------------------


def test_describe_catalog_says_which_pinned_snapshots_are_present(tmp_path):
    folder = write_snapshot(tmp_path / "cache", REPO, PINNED)
    write_snapshot(tmp_path / "cache", "spinf/gemma-4-31b-fp8", OTHER)
    rows = {row["id"]: row for row in describe_catalog([str(tmp_path / "cache")], str(tmp_path / "hf"))}
    assert rows[REPO] == {
        "id": REPO,
        "name": "spinf Gemma 4 12B",
        "aliases": ["spinf-12b", "google/gemma-4-12B", "gemma-4-12b"],
        "family": "gemma4",
        "status": "available",
        "present": True,
        "path": str(folder),
    }
    assert (rows["spinf/gemma-4-31b-fp8"]["present"], rows["spinf/gemma-4-31b-fp8"]["path"]) == (False, None)
    assert rows["spinf/tiny-gemma4"]["present"] is False
    assert len(rows) == 5


# -- the completeness check itself --------------------------------------------------------------------------------


def test_safetensors_problem_reads_the_header(tmp_path):
    folder = write_checkpoint(tmp_path / "ckpt", index=False, shards=1)
    shard = folder / "model.safetensors"
    assert safetensors_problem(shard) is None
    header_len = int.from_bytes(shard.read_bytes()[:8], "little")
    header = json.loads(shard.read_bytes()[8 : 8 + header_len])
    end = max(entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__")
    assert shard.stat().st_size == 8 + header_len + end
    truncate(shard)
    assert re.fullmatch(
        rf"truncated \({8 + header_len + end - 1} bytes, the header says {8 + header_len + end}\)",
        safetensors_problem(shard),
    )
    assert safetensors_problem(folder / "absent.safetensors") == "missing"
    (folder / "tiny.safetensors").write_bytes(b"\x01\x00")
    assert safetensors_problem(folder / "tiny.safetensors").startswith("truncated (header of -1 bytes")
