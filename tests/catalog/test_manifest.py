"""Tests of the manifests: the shipped catalog matches api spec §9.5, every rule refuses a manifest that breaks it,
and ``SPINF_MANIFEST_DIRS`` adds and replaces manifests."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomlkit

from spinf.catalog import load_catalog
from spinf.catalog.manifest import BUILTIN_DIR, TINY_REPO
from spinf.errors import ConfigError

GEMMA_ALLOWED = ("fp8s", "fp8", "fp8row", "w8a16", "w8a8", "bf16")
INT4_ALLOWED = ("i8", "f16", "fp8", "bf16")
ALL_CAPABILITIES = ("score", "extract", "generate")
GEMMA_IMAGE = ("gemma", 48, {"low": 70, "auto": 280, "high": 1120})

# The built-in catalog table of §9.5, one row per model, plus the tiny model.
EXPECTED = {
    "spinf/gemma-4-12b-fp8": dict(
        name="spinf Gemma 4 12B",
        aliases=("spinf-12b", "google/gemma-4-12B", "gemma-4-12b"),
        family="gemma4",
        media=("image", "audio", "video"),
        repo="spinf/gemma-4-12b-fp8",
        revision="a689df2c5f611e3bfaa4569b8190f97db5018569",
        format="fp8-static",
        allowed=GEMMA_ALLOWED,
        image=GEMMA_IMAGE,
        limits=(16384, 65536),
        head="lm_head",
        capabilities=ALL_CAPABILITIES,
        prompt_style="default",
        builtin=False,
    ),
    "spinf/gemma-4-31b-fp8": dict(
        name="spinf Gemma 4 31B",
        aliases=("spinf-31b", "google/gemma-4-31B", "gemma-4-31b"),
        family="gemma4",
        media=("image", "video"),
        repo="spinf/gemma-4-31b-fp8",
        revision="8c54e9850ccca10823f2936c77ed045c735e123d",
        format="fp8-static",
        allowed=GEMMA_ALLOWED,
        image=GEMMA_IMAGE,
        limits=(16384, 32768),
        head="lm_head",
        capabilities=ALL_CAPABILITIES,
        prompt_style="default",
        builtin=False,
    ),
    "spinf/qwen3.8-27b-int4": dict(
        name="spinf Qwen3.8 27B",
        aliases=("qwen3.8-27b-s",),
        family="qwen35",
        media=("image", "video"),
        repo="spinf/qwen3.8-27b-int4",
        revision="22de4859c04ccdb4136d89b66e56e717db752c7c",
        format="gptq-int4-g32",
        allowed=INT4_ALLOWED,
        image=("qwen", 32, {"low": 256, "auto": 1024, "high": 4096}),
        limits=(16384, 16384),
        head="lm_head",
        capabilities=ALL_CAPABILITIES,
        prompt_style="default",
        builtin=False,
    ),
    "spinf/pplx-decider-v1-27b-int4": dict(
        name="spinf pplx-decider 27B",
        aliases=(),
        family="qwen35",
        media=(),
        repo="spinf/pplx-decider-v1-27b-int4",
        revision="5579a6ec32478b65920cb2a1d9fd23349fb51699",
        format="gptq-int4-g32",
        allowed=INT4_ALLOWED,
        image=None,
        limits=(16384, 16384),
        head="readout",
        capabilities=("score",),
        prompt_style="decider",
        builtin=False,
    ),
    "spinf/tiny-gemma4": dict(
        name="spinf tiny Gemma 4",
        aliases=("tiny",),
        family="gemma4",
        media=("image", "audio", "video"),  # the 12B's: small random embedders in its layout
        repo="spinf/tiny-gemma4",
        revision=None,  # checked against TINY_REVISION below
        format="safetensors-f32",
        allowed=("fp32", "fp8s"),
        image=GEMMA_IMAGE,
        limits=(16384, 65536),
        head="lm_head",
        capabilities=ALL_CAPABILITIES,
        prompt_style="default",
        builtin=True,
    ),
}


def test_the_builtin_catalog_has_exactly_the_table_models():
    assert sorted(manifest.id for manifest in load_catalog([]).manifests) == sorted(EXPECTED)


@pytest.mark.parametrize("model_id", sorted(EXPECTED))
def test_shipped_manifest_matches_the_spec_table(model_id):
    manifest = load_catalog([]).find(model_id)
    want = EXPECTED[model_id]
    assert manifest.id == model_id
    assert manifest.name == want["name"]
    assert manifest.aliases == want["aliases"]
    assert manifest.status == "available"
    assert manifest.family == want["family"]
    assert manifest.media == want["media"]
    assert manifest.source.repo == want["repo"]
    if want["revision"] is not None:
        assert manifest.source.revision == want["revision"]
    assert manifest.source.format == want["format"]
    assert manifest.source.builtin is want["builtin"]
    assert manifest.quant_default == "auto"
    assert manifest.quant_allowed == want["allowed"]
    if want["image"] is None:
        assert manifest.image is None
    else:
        assert (manifest.image.scheme, manifest.image.side, manifest.image.detail_tokens) == want["image"]
    assert (manifest.token_budget, manifest.max_tokens) == want["limits"]
    assert manifest.head == want["head"]
    assert manifest.capabilities == want["capabilities"]
    assert manifest.prompt_style == want["prompt_style"]


def test_tiny_manifest_pins_the_generators_revision():
    from spinf.engine.gemma4.tiny import TINY_MODEL_ID, TINY_REVISION

    manifest = load_catalog([]).find("tiny")
    assert TINY_REPO == TINY_MODEL_ID
    assert (manifest.id, manifest.source.repo, manifest.source.revision) == (
        TINY_MODEL_ID,
        TINY_MODEL_ID,
        TINY_REVISION,
    )


def test_every_builtin_manifest_gives_its_checkpoints_size():
    """The start checks the memory with it before downloading anything; the tiny model's is the generated file's."""
    from spinf.engine.gemma4.tiny import snapshot_files

    sizes = {manifest.id: manifest.source.bytes for manifest in load_catalog([]).manifests}
    assert all(isinstance(size, int) and size > 0 for size in sizes.values()), sizes
    assert sizes[TINY_REPO] == len(snapshot_files()["model.safetensors"])
    assert 12e9 < sizes["spinf/gemma-4-12b-fp8"] < 14e9  # engine spec B.19: 10.9 B fp8 linears + a bf16 embedding


def test_a_manifest_without_a_size_is_valid(tmp_path):
    write_manifest(tmp_path, VALID)
    assert load_catalog([tmp_path]).find("acme-7b").source.bytes is None
    write_manifest(tmp_path, mutated(_set("source.bytes", 7_000_000_000)))
    assert load_catalog([tmp_path]).find("acme-7b").source.bytes == 7_000_000_000


def test_manifest_files_are_package_data():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["spinf"]
    assert "catalog/**/*.toml" in patterns
    assert sorted(BUILTIN_DIR.glob("*.toml")), "no manifests shipped"


def test_importing_the_catalog_does_not_import_torch():
    code = "import spinf.catalog, sys; spinf.catalog.resolve_model('tiny'); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# -- the rules ---------------------------------------------------------------------------------------------------

VALID = {
    "id": "acme/scorer-7b",
    "name": "Acme scorer 7B",
    "aliases": ["acme-7b"],
    "family": "gemma4",
    "media": ["image"],
    "source": {
        "repo": "acme/scorer-7b",
        "revision": "0123456789abcdef0123456789abcdef01234567",
        "format": "fp8-static",
    },
    "quant": {"default": "auto", "allowed": ["fp8", "bf16"]},
    "image": {"scheme": "gemma", "side": 48, "detail_tokens": {"low": 70, "auto": 280, "high": 1120}},
    "limits": {"token_budget": 8192, "max_tokens": 32768},
}


def write_manifest(folder: Path, data: dict, name: str = "model.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(tomlkit.dumps(data))
    return path


def mutated(change) -> dict:
    data = copy.deepcopy(VALID)
    change(data)
    return data


def test_a_valid_manifest_loads_with_defaults(tmp_path):
    data = mutated(lambda d: [d.pop(key) for key in ("aliases", "media", "image", "limits", "quant")])
    write_manifest(tmp_path, data)
    manifest = load_catalog([tmp_path]).find("ACME/Scorer-7B")
    assert manifest.aliases == ()
    assert manifest.status == "available"
    assert manifest.head == "lm_head"
    assert manifest.capabilities == ALL_CAPABILITIES
    assert manifest.prompt_style == "default"
    assert manifest.media == ()
    assert (manifest.token_budget, manifest.max_tokens) == (16384, 65536)
    assert (manifest.quant_default, manifest.quant_allowed) == ("auto", GEMMA_ALLOWED)


def test_a_planned_manifest_needs_no_revision(tmp_path):
    data = mutated(lambda d: (d.update(status="planned"), d["source"].pop("revision")))
    write_manifest(tmp_path, data)
    assert load_catalog([tmp_path]).find("acme-7b").source.revision is None


def _set(path: str, value):
    def change(data):
        *parents, last = path.split(".")
        table = data
        for key in parents:
            table = table[key]
        table[last] = value

    return change


def _drop(path: str):
    def change(data):
        *parents, last = path.split(".")
        table = data
        for key in parents:
            table = table[key]
        del table[last]

    return change


RULES = [
    ("id", _set("id", "-acme/scorer")),
    ("id", _set("id", "acme/scorer/7b")),
    ("id", _drop("id")),
    ("name", _set("name", "")),
    ("aliases", _set("aliases", ["acme 7b"])),
    ("aliases", _set("aliases", "acme-7b")),
    ("status", _set("status", "beta")),
    ("family", _set("family", "llama")),
    ("family", _drop("family")),
    ("source", _drop("source")),
    ("source.repo", _set("source.repo", "scorer-7b")),
    ("source.revision", _drop("source.revision")),
    ("source.revision", _set("source.revision", "0123456789ABCDEF0123456789ABCDEF01234567")),
    ("source.revision", _set("source.revision", "main")),
    ("source.format", _set("source.format", "gguf")),
    ("source.format", _set("source.format", "safetensors-f32")),
    ("source.builtin", _set("source.builtin", True)),
    ("source.bytes", _set("source.bytes", 0)),
    ("source.bytes", _set("source.bytes", "13 GB")),
    ("source.bytes", lambda d: (d.update(status="planned"), d["source"].pop("revision"), d["source"].update(bytes=1))),
    ("quant.default", _set("quant.default", "w8a8")),
    ("quant.allowed", _set("quant.allowed", ["fp8", "i8"])),
    ("quant.allowed", _set("quant.allowed", [])),
    ("head", _set("head", "mlp")),
    ("capabilities", _set("capabilities", ["score", "chat"])),
    ("capabilities", lambda d: d.update(head="readout", capabilities=["score", "extract"])),
    ("capabilities", lambda d: d.update(head="readout")),
    ("prompt_style", _set("prompt_style", "chatty")),
    ("media", _set("media", ["image", "smell"])),
    ("image", _drop("image")),
    ("image", lambda d: (d.pop("image"), d.update(media=["video"]))),
    ("image.scheme", _set("image.scheme", "llava")),
    ("image.side", _set("image.side", "48")),
    ("image.detail_tokens", _drop("image.detail_tokens")),
    ("image.detail_tokens.high", _drop("image.detail_tokens.high")),
    ("limits.token_budget", _set("limits.token_budget", 0)),
    ("limits.max_tokens", _set("limits.max_tokens", True)),
    ("colour", _set("colour", "blue")),
    ("source.mirror", _set("source.mirror", "https://example.com")),
    ("quant.auto", _set("quant.auto", True)),
    ("image.detail_tokens.ultra", _set("image.detail_tokens.ultra", 9000)),
    ("limits.max_body_bytes", _set("limits.max_body_bytes", 1)),
]


@pytest.mark.parametrize(("key", "change"), RULES, ids=[f"{key}-{n}" for n, (key, _) in enumerate(RULES)])
def test_each_rule_violation_names_the_file_and_key(tmp_path, key, change):
    path = write_manifest(tmp_path, mutated(change))
    with pytest.raises(ConfigError, match=rf"^manifest {re.escape(str(path))}: key {re.escape(key)}: "):
        load_catalog([tmp_path])


def test_readout_head_that_only_scores_is_accepted(tmp_path):
    write_manifest(tmp_path, mutated(lambda d: d.update(head="readout", capabilities=["score"])))
    assert load_catalog([tmp_path]).find("acme-7b").head == "readout"


@pytest.mark.parametrize("clash", ["SPINF-12B", "Spinf/Gemma-4-12B-fp8x", "TINY"])
def test_a_name_of_another_manifest_is_refused_case_insensitively(tmp_path, clash):
    data = mutated(_set("aliases", ["acme-7b", clash]))
    if clash == "Spinf/Gemma-4-12B-fp8x":
        # Not a clash by itself; give a second extra manifest that alias as its id.
        other = mutated(lambda d: d.update(id="spinf/gemma-4-12b-FP8X", aliases=[]))
        write_manifest(tmp_path, other, "a.toml")
    path = write_manifest(tmp_path, data, "b.toml")
    with pytest.raises(ConfigError, match=rf"^manifest {re.escape(str(path))}: key aliases: the name {clash!r}"):
        load_catalog([tmp_path])


def test_an_alias_that_is_another_manifests_id_is_refused(tmp_path):
    path = write_manifest(tmp_path, mutated(_set("aliases", ["spinf/qwen3.8-27B-int4"])))
    with pytest.raises(ConfigError, match=rf"^manifest {re.escape(str(path))}: key aliases: .*qwen3.8-27b-int4"):
        load_catalog([tmp_path])


def test_a_toml_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('id = "acme/x"\nname = \n')
    with pytest.raises(ConfigError, match=rf"^manifest {re.escape(str(path))}: cannot be read as TOML"):
        load_catalog([tmp_path])


def test_a_missing_manifest_folder_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^SPINF_MANIFEST_DIRS: .*nowhere is not a folder$"):
        load_catalog([tmp_path / "nowhere"])


# -- SPINF_MANIFEST_DIRS -----------------------------------------------------------------------------------------


def test_manifest_dirs_from_the_environment_add_a_model(tmp_path, monkeypatch):
    write_manifest(tmp_path / "one", VALID)
    monkeypatch.setenv("SPINF_MANIFEST_DIRS", f"{tmp_path / 'one'}:")
    catalog = load_catalog()
    assert catalog.find("acme-7b").id == "acme/scorer-7b"
    assert catalog.find("spinf-12b").id == "spinf/gemma-4-12b-fp8"
    assert len(catalog.manifests) == len(EXPECTED) + 1


def test_a_later_manifest_with_the_same_id_replaces_the_earlier(tmp_path, monkeypatch):
    write_manifest(tmp_path / "one", VALID)
    write_manifest(tmp_path / "two", mutated(lambda d: d.update(name="Acme v2", aliases=["acme-7b-v2"])))
    monkeypatch.setenv("SPINF_MANIFEST_DIRS", f"{tmp_path / 'one'}:{tmp_path / 'two'}")
    catalog = load_catalog()
    assert catalog.find("acme/scorer-7b").name == "Acme v2"
    assert catalog.find("acme-7b") is None  # the replaced manifest's aliases go with it
    assert catalog.find("acme-7b-v2").name == "Acme v2"


def test_an_extra_manifest_replaces_a_builtin_one(tmp_path):
    replacement = mutated(
        lambda d: d.update(id="spinf/gemma-4-12b-fp8", name="patched 12B", aliases=["spinf-12b"], media=[])
    )
    replacement.pop("image")
    write_manifest(tmp_path, replacement)
    catalog = load_catalog([tmp_path])
    assert catalog.find("spinf-12b").name == "patched 12B"
    assert catalog.find("gemma-4-12b") is None
    assert len(catalog.manifests) == len(EXPECTED)
