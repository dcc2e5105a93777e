"""fp8s through the engine: the scale table's lookup chooses the scheme (api spec §9.8), loading it quantizes the
model, and its id is part 8 of the fingerprint (§11). The device facts of a GPU are injected, so that only the
gpu-marked tests need one."""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch

from spinf import Engine, __version__
from spinf.catalog import resolve_model
from spinf.cli import main
from spinf.engine import opening as engine_module
from spinf.engine.calibrate import calibrate
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.engine.hardware import GIB, DeviceFacts
from spinf.engine.scales import SHIPPED_TABLE, find_table, read_scale_table, store_path, table_id, write_table
from spinf.errors import ConfigError, ModelError

from ..catalog.hub import write_snapshot
from ..test_reference_gemma_files import fused_max, projection_amax, reference_table, write_reference_table
from .test_calibrate import CORPUS
from .test_independence import CONTENT, TARGETS, body, numbers, other_questions

HOPPER, AMPERE = (9, 0), (8, 0)
REVISION = "0123456789abcdef0123456789abcdef01234567"
BF16_MANIFEST = (
    'id = "acme/tiny-bf16"\nname = "tiny in bf16"\nfamily = "gemma4"\n'
    f'[source]\nrepo = "acme/tiny-bf16"\nrevision = "{REVISION}"\nformat = "safetensors-bf16"\n'
)


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    """An empty table store (and Hub cache) of each test's own: ``HF_HOME`` is where the store lies."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("SPINF_MANIFEST_DIRS", "SPINF_CACHE_DIRS", "SPINF_QUANT", "SPINF_MODEL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hf" / "spinf" / "scales"


@pytest.fixture
def catalog_bf16(tmp_path, monkeypatch):
    """A catalog model stored in bf16 (the kind fp8s quantizes at load): its manifest and a snapshot of it."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "tiny-bf16.toml").write_text(BF16_MANIFEST)
    monkeypatch.setenv("SPINF_MANIFEST_DIRS", str(manifests))
    root = tmp_path / "cache"
    write_snapshot(root, "acme/tiny-bf16", REVISION)
    return root


@pytest.fixture
def on_gpu(monkeypatch):
    """``device_facts`` of open_checkpoint answers for a fake GPU of the capability set by calling the fixture."""

    def use(capability=HOPPER):
        facts = DeviceFacts(device="cuda:0", name="fake GPU", capability=capability, free_bytes=80 * GIB)
        monkeypatch.setattr(engine_module, "device_facts", lambda device: facts)

    use()
    return use


def open_bf16(root, quant=""):
    resolved, checkpoint, scheme = engine_module.open_checkpoint(
        resolve_model("acme/tiny-bf16"), device="cuda:0", quant=quant, cache_dirs=[str(root)]
    )
    return scheme


def some_table(model_id="acme/tiny-bf16", revision=REVISION, scales=None) -> dict:
    return {"format": 1, "model": model_id, "revision": revision, "scheme": "fp8s", "scales": scales or {}}


# -- choosing fp8s -------------------------------------------------------------------------------------------------


def test_without_a_table_the_automatic_choice_is_dynamic_fp8(catalog_bf16, on_gpu):
    assert open_bf16(catalog_bf16) == "fp8"  # §9.8: fp8, upgraded to fp8s only with a table


def test_with_a_table_in_the_store_the_automatic_choice_is_fp8s(catalog_bf16, on_gpu):
    write_table(some_table(), store_path("acme/tiny-bf16", REVISION))
    assert open_bf16(catalog_bf16) == "fp8s"
    assert open_bf16(catalog_bf16, "bf16") == "bf16"


def test_a_table_shipped_in_the_checkpoint_folder_counts_too(catalog_bf16, on_gpu):
    folder = catalog_bf16 / "models--acme--tiny-bf16" / "snapshots" / REVISION
    write_table(some_table(), folder / SHIPPED_TABLE)
    assert open_bf16(catalog_bf16) == "fp8s"


def test_fp8s_without_a_table_names_the_store_path_and_the_command(catalog_bf16, on_gpu, store):
    path = store / "acme--tiny-bf16" / f"{REVISION}.json"
    with pytest.raises(ModelError) as refused:
        open_bf16(catalog_bf16, "fp8s")
    assert str(refused.value) == (
        f"acme/tiny-bf16: the fp8s scheme needs a scale table for acme/tiny-bf16 at revision {REVISION}, and there "
        f"is none at {path} (nor {store}/tables/acme__tiny-bf16/{REVISION}.json, "
        f"{catalog_bf16}/models--acme--tiny-bf16/snapshots/{REVISION}/{SHIPPED_TABLE}). "
        "Make one with `SPINF_MODEL=acme/tiny-bf16 spinf-serve calibrate --corpus FILE` under the same settings, "
        "or choose another scheme with --quant"
    )


def test_a_table_is_looked_up_under_the_model_id_setting(catalog_bf16, on_gpu):
    write_table(some_table("acme/renamed"), store_path("acme/renamed", REVISION))
    assert open_bf16(catalog_bf16) == "fp8"  # not under the checkpoint's own repo
    _, _, scheme = engine_module.open_checkpoint(
        resolve_model("acme/tiny-bf16"), device="cuda:0", cache_dirs=[str(catalog_bf16)], model_id="acme/renamed"
    )
    assert scheme == "fp8s"


def test_fp8s_before_ada_is_refused_even_with_a_table(catalog_bf16, on_gpu):
    write_table(some_table(), store_path("acme/tiny-bf16", REVISION))
    on_gpu(AMPERE)
    with pytest.raises(ConfigError, match=r"^quant 'fp8s' needs compute capability 8\.9 or later; cuda:0 "):
        open_bf16(catalog_bf16, "fp8s")
    assert open_bf16(catalog_bf16) == "bf16"


def test_fp8s_on_the_cpu_needs_a_table_too(tiny_cache):
    """The CPU emulates fp8s for the tiny model (spinf.engine.schemes), with a scale table as on a GPU."""
    with pytest.raises(ModelError, match=r"^spinf/tiny-gemma4: the fp8s scheme needs a scale table for "):
        Engine("tiny", device="cpu", cache_dir=tiny_cache, quant="fp8s")


def test_a_pre_quantized_fp8_checkpoint_needs_no_scale_table(tmp_path, on_gpu):
    """Its input scales are in the checkpoint: the automatic choice is fp8s with no table anywhere, and any other
    scheme may be asked (the weights are then dequantized, `spinf.engine.gemma4.fp8_static`)."""
    root = tmp_path / "cache"
    write_snapshot(root, "spinf/gemma-4-12b-fp8", "a689df2c5f611e3bfaa4569b8190f97db5018569")
    for quant, scheme in (("", "fp8s"), ("bf16", "bf16"), ("fp8", "fp8")):
        _, checkpoint, chosen = engine_module.open_checkpoint(
            resolve_model("spinf-12b"), device="cuda:0", quant=quant, cache_dirs=[str(root)]
        )
        assert (checkpoint.weight_format, chosen) == ("fp8-static", scheme)


# -- loading a table -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_table(tiny_engine) -> dict:
    return calibrate(tiny_engine, CORPUS)


def fresh_model(tiny_engine):
    return load_gemma4_text(tiny_engine.folder)


def load_scale_table(model, name: str, model_id: str, revision: str, folder) -> str:
    """Quantize a loaded float ``model`` to fp8s with the checkpoint revision's table, as the engine does while
    loading (`read_scale_table`, then the scales, a failure naming the table); the table's id."""
    path, table, found = read_scale_table(name, model_id, revision, folder)
    try:
        model.to_fp8s(table["scales"])
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from exc
    return found


def load(model, tiny_engine):
    return load_scale_table(model, "tiny", tiny_engine.model_id, tiny_engine.revision, tiny_engine.folder)


def test_loading_the_stored_table_quantizes_every_linear_and_gives_its_id(tiny_engine, tiny_table):
    path = store_path(tiny_engine.model_id, tiny_engine.revision)
    written = write_table(tiny_table, path)
    model = fresh_model(tiny_engine)
    assert load(model, tiny_engine) == written == table_id(path.read_bytes())
    for layer in model.layers:
        assert set(layer.fp8) == {"wqkv", "wo", "w_gate_up", "w_down"}
        assert layer.fp8["wo"][1] == tiny_table["scales"][layer.prefix + "wo"]


def test_the_store_comes_before_a_shipped_table(tiny_engine, tiny_table, tmp_path):
    folder = tmp_path / "checkpoint"
    shutil.copytree(tiny_engine.folder, folder)
    shipped = write_table({**tiny_table, "revision": "anything"}, folder / SHIPPED_TABLE)
    model = fresh_model(tiny_engine)
    assert load_scale_table(model, "tiny", tiny_engine.model_id, tiny_engine.revision, folder) == shipped
    stored = write_table(tiny_table, store_path(tiny_engine.model_id, tiny_engine.revision))
    assert find_table(tiny_engine.model_id, tiny_engine.revision, folder) == store_path(
        tiny_engine.model_id, tiny_engine.revision
    )
    model = fresh_model(tiny_engine)
    assert load_scale_table(model, "tiny", tiny_engine.model_id, tiny_engine.revision, folder) == stored != shipped


def test_a_stored_table_of_another_revision_is_refused(tiny_engine, tiny_table):
    path = store_path(tiny_engine.model_id, tiny_engine.revision)
    write_table({**tiny_table, "revision": "feedface"}, path)
    with pytest.raises(ModelError) as refused:
        load(fresh_model(tiny_engine), tiny_engine)
    assert str(refused.value) == (
        f"the scale table {path} is for spinf/tiny-gemma4 at revision feedface, not spinf/tiny-gemma4 at "
        f"{tiny_engine.revision}; recalibrate with `SPINF_MODEL=tiny spinf-serve calibrate --corpus FILE`"
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"scheme": "fp8"}, "is not an fp8s table of format 1 or the reference's"),
        ({"format": 2}, "is not an fp8s table of format 1 or the reference's"),
        ({"scales": {}}, "has no scales, or a scale that is not a positive number"),
        ({"scales": {"layers.0.wqkv": -1.0}}, "has no scales, or a scale that is not a positive number"),
        ({"scales": {"layers.0.wqkv": "1"}}, "has no scales, or a scale that is not a positive number"),
    ],
)
def test_a_malformed_table_is_refused(tiny_engine, tiny_table, change, problem):
    path = store_path(tiny_engine.model_id, tiny_engine.revision)
    write_table({**tiny_table, **change}, path)
    with pytest.raises(ModelError, match=rf"^the scale table {re.escape(str(path))} {problem}$"):
        load(fresh_model(tiny_engine), tiny_engine)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda data: data[: len(data) // 2], r"is not JSON: .*\(char \d+\)"),  # a copy cut short
        (lambda data: b"\xc3(" + data, r"is not JSON: 'utf-8' codec can't decode byte 0xc3 in position 0: .*"),
        (lambda data: b"[1, 2]", "is not an fp8s table of format 1 or the reference's"),
    ],
)
def test_a_corrupt_table_is_one_line_naming_it(tiny_engine, tiny_table, damage, problem):
    path = store_path(tiny_engine.model_id, tiny_engine.revision)
    write_table(tiny_table, path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ModelError, match=rf"^the scale table {re.escape(str(path))} {problem}$"):
        load(fresh_model(tiny_engine), tiny_engine)


def test_an_unreadable_table_is_one_line_naming_it(tiny_engine, tiny_table, monkeypatch):
    path = store_path(tiny_engine.model_id, tiny_engine.revision)
    write_table(tiny_table, path)
    read_bytes = Path.read_bytes

    def refuse(self):  # a permission error, faked: the tests may run as root, whom no mode bit stops
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(
        ModelError, match=rf"^the scale table {re.escape(str(path))} cannot be read: Permission denied$"
    ):
        load(fresh_model(tiny_engine), tiny_engine)


def test_a_table_missing_a_linear_is_refused_with_its_path(tiny_engine, tiny_table):
    path = store_path(tiny_engine.model_id, tiny_engine.revision)
    scales = {k: v for k, v in tiny_table["scales"].items() if k != "layers.3.w_down"}
    write_table({**tiny_table, "scales": scales}, path)
    expected = rf"^{re.escape(str(path))}: the scale table has no scale for 1 linears, e\.g\. layers\.3\.w_down$"
    with pytest.raises(ModelError, match=expected):
        load(fresh_model(tiny_engine), tiny_engine)


def test_loading_without_a_table_is_the_missing_table_error(tiny_engine):
    with pytest.raises(ModelError, match=r"^tiny: the fp8s scheme needs a scale table for spinf/tiny-gemma4 at "):
        load(fresh_model(tiny_engine), tiny_engine)


# -- the reference engine's tables ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_scales(tiny_engine) -> dict:
    """The tiny model's table as the reference engine writes it (per projection, q/k/v and gate/up apart)."""
    return reference_table(tiny_engine.model_id, tiny_engine.revision, projection_amax(tiny_engine.model))


def layer_scales(model) -> dict[str, float]:
    return {layer.prefix + name: scale for layer in model.layers for name, (_, scale) in layer.fp8.items()}


def test_a_reference_table_gives_the_scales_of_ours_each_fused_linear_its_largest(
    tiny_engine, reference_scales, store
):
    path = write_reference_table(store / "tables", tiny_engine.model_id, tiny_engine.revision, reference_scales)
    assert find_table(tiny_engine.model_id, tiny_engine.revision, tiny_engine.folder) == path
    model = fresh_model(tiny_engine)
    assert load(model, tiny_engine) == table_id(path.read_bytes())  # the file's bytes, as the reference hashes them
    expected = fused_max(reference_scales["scales"])
    assert layer_scales(model) == expected
    assert expected["layers.0.wqkv"] == reference_scales["scales"]["layers.0.self_attn.k_proj"]  # k's is the largest
    assert expected["layers.0.w_gate_up"] == reference_scales["scales"]["layers.0.mlp.gate_proj"] > 2**-4
    ours = fresh_model(tiny_engine)
    write_table(
        some_table(tiny_engine.model_id, tiny_engine.revision, expected),
        store_path(tiny_engine.model_id, tiny_engine.revision),
    )
    load(ours, tiny_engine)
    for a, b in zip(model.layers, ours.layers, strict=True):  # the same e4m3 weights as well
        for name in a.fp8:
            assert torch.equal(a.fp8[name][0].data.view(torch.uint8), b.fp8[name][0].data.view(torch.uint8))


def test_the_store_of_ours_comes_before_the_reference_layout_then_the_reference_package(
    tiny_engine, reference_scales, store, tmp_path, monkeypatch
):
    """The reference keeps its tables in its package (``spinf_serve/quant/tables``); what a pip upgrade leaves of it
    (a folder without ``__init__.py``) is found too."""
    model_id, revision = tiny_engine.model_id, tiny_engine.revision
    site = tmp_path / "site-packages"
    package = write_reference_table(site / "spinf_serve" / "quant" / "tables", model_id, revision, reference_scales)
    assert find_table(model_id, revision, tiny_engine.folder) is None
    monkeypatch.syspath_prepend(str(site))
    assert find_table(model_id, revision, tiny_engine.folder) == package
    in_store = write_reference_table(store / "tables", model_id, revision, reference_scales)
    assert find_table(model_id, revision, tiny_engine.folder) == in_store
    write_table(some_table(model_id, revision), store_path(model_id, revision))
    assert find_table(model_id, revision, tiny_engine.folder) == store_path(model_id, revision)


def test_a_reference_table_makes_the_automatic_choice_fp8s(catalog_bf16, on_gpu, store, reference_scales):
    write_reference_table(store / "tables", "acme/tiny-bf16", REVISION, {**reference_scales, "model_id": "x/y"})
    assert open_bf16(catalog_bf16) == "fp8s"


def test_unknown_keys_are_logged_once_and_ignored(tiny_engine, reference_scales, store, caplog):
    table = {**reference_scales, "notes": "hand-made"}
    table["scales"] = {**table["scales"], "layers.0.per_layer_input_gate": 1.0}
    path = write_reference_table(store / "tables", tiny_engine.model_id, tiny_engine.revision, table)
    with caplog.at_level(logging.WARNING, logger="spinf.engine.scales"):
        for _ in range(2):
            load(fresh_model(tiny_engine), tiny_engine)
    assert caplog.text.count(f"{path}: ignoring what this engine does not read: notes") == 1
    assert caplog.text.count(f"{path} scales: ignoring what this engine does not read: layers.0.per_layer_input") == 1
    stored = write_table(
        {**some_table(tiny_engine.model_id, tiny_engine.revision, fused_max(reference_scales["scales"])), "extra": 1},
        store_path(tiny_engine.model_id, tiny_engine.revision),
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spinf.engine.scales"):
        assert load(fresh_model(tiny_engine), tiny_engine) == stored
    assert "ignoring what this engine does not read: extra" in caplog.text


def test_a_reference_table_read_where_it_lies_whatever_revision_it_names(tiny_engine, reference_scales, store, caplog):
    """The reference keys a table by its path alone (its calibration writes the folder's name as the revision)."""
    table = {**reference_scales, "revision": "tiny-local-dir"}
    path = write_reference_table(store / "tables", tiny_engine.model_id, tiny_engine.revision, table)
    with caplog.at_level(logging.WARNING, logger="spinf.engine.scales"):
        assert load(fresh_model(tiny_engine), tiny_engine) == table_id(path.read_bytes())
    assert "says spinf/tiny-gemma4 at revision tiny-local-dir" in caplog.text


def test_a_reference_table_without_a_projection_the_engine_fuses_is_refused(tiny_engine, reference_scales, store):
    scales = {k: v for k, v in reference_scales["scales"].items() if k != "layers.2.mlp.up_proj"}
    path = write_reference_table(
        store / "tables", tiny_engine.model_id, tiny_engine.revision, {**reference_scales, "scales": scales}
    )
    expected = (
        rf"^the scale table {re.escape(str(path))} has no scale for layers\.2\.mlp\.up_proj, which the engine runs "
        rf"fused with layers\.2\.mlp\.gate_proj$"
    )
    with pytest.raises(ModelError, match=expected):
        load(fresh_model(tiny_engine), tiny_engine)
    scales = {k: v for k, v in reference_scales["scales"].items() if not k.startswith("layers.4.")}
    write_reference_table(
        store / "tables", tiny_engine.model_id, tiny_engine.revision, {**reference_scales, "scales": scales}
    )
    with pytest.raises(ModelError, match=r": the scale table has no scale for 4 linears, e\.g\. layers\.4\.wqkv$"):
        load(fresh_model(tiny_engine), tiny_engine)


# -- the fingerprint and /v0/info ----------------------------------------------------------------------------------


def fingerprint(*parts: str) -> str:
    return "fp_" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:10]


def test_the_table_id_is_part_8_of_the_fingerprint_for_fp8s_only(tiny_engine, monkeypatch):
    monkeypatch.delenv("GIT_SHA", raising=False)
    parts = ["spinf/tiny-gemma4", tiny_engine.revision, "fp8s", "unknown", __version__, "cpu", "fp32"]
    engine = copy.copy(tiny_engine)
    engine.quant, engine.scale_table = "fp8s", "0a1b2c3d4e"
    assert engine._fingerprint() == fingerprint(*parts, "0a1b2c3d4e")
    first = engine._fingerprint()
    engine.scale_table = "ffffffffff"
    assert engine._fingerprint() == fingerprint(*parts, "ffffffffff") != first
    engine.quant = "bf16"
    parts[2] = "bf16"
    assert engine._fingerprint() == fingerprint(*parts)


def test_info_names_the_table_only_when_there_is_one(tiny_engine):
    assert "scale_table" not in tiny_engine.info()
    engine = copy.copy(tiny_engine)
    engine.quant, engine.scale_table = "fp8s", "0a1b2c3d4e"
    info = engine.info()
    assert info["scale_table"] == "0a1b2c3d4e" and list(info).index("scale_table") == list(info).index("quant") + 1


# -- spinf-serve calibrate, then serve -------------------------------------------------------------------------------


def calibrate_command(tmp_path, device: str) -> None:
    corpus = tmp_path / "corpus.json.gz"
    corpus.write_bytes(gzip.compress(json.dumps(CORPUS).encode()))
    assert main(["calibrate", "--corpus", str(corpus), "--device", device]) == 0


def test_calibrate_writes_where_the_engine_looks_whatever_the_quant_setting(
    tmp_path, monkeypatch, tiny_engine, tiny_cache
):
    monkeypatch.setenv("SPINF_MODEL", "tiny")
    monkeypatch.setenv("SPINF_CACHE_DIRS", str(tiny_cache))
    monkeypatch.setenv("SPINF_QUANT", "fp8s")  # calibration runs in dynamic fp8: fp8s would need the table it makes
    calibrate_command(tmp_path, "cpu")
    path = find_table(tiny_engine.model_id, tiny_engine.revision, tiny_engine.folder)
    assert path == store_path(tiny_engine.model_id, tiny_engine.revision)
    assert json.loads(path.read_text())["environment"]["quant"] == "fp8"
    assert load(fresh_model(tiny_engine), tiny_engine) == table_id(path.read_bytes())


# -- on a GPU ------------------------------------------------------------------------------------------------------


def option_ps(answer: dict) -> dict:
    return {key: value[1] for key, value in numbers(answer).items() if len(value) == 3}


@pytest.mark.gpu
def test_the_tiny_model_serves_fp8s_on_a_gpu_after_calibrating(tiny_cache, monkeypatch):
    exact = Engine("tiny", device="cuda", cache_dir=tiny_cache)
    assert exact.quant == "fp32" and exact.scale_table is None  # the automatic choice for the tiny model
    written = write_table(calibrate(exact, CORPUS), store_path(exact.model_id, exact.revision))
    engine = Engine("tiny", device="cuda", cache_dir=tiny_cache, quant="fp8s")
    assert (engine.quant, engine.scale_table, engine.info()["scale_table"]) == ("fp8s", written, written)
    assert engine.batch_invariant  # a catalog model under fp8s on a GPU
    monkeypatch.delenv("GIT_SHA", raising=False)
    parts = ["spinf/tiny-gemma4", engine.revision, "fp8s", "unknown", __version__, engine.capability(), "f32out"]
    assert engine._fingerprint() == fingerprint(*parts, written)
    targets = body(TARGETS, [("a", CONTENT)])
    exact_ps, fp8s_ps = option_ps(exact.score(targets)), option_ps(engine.score(targets))
    assert max(abs(exact_ps[k] - fp8s_ps[k]) for k in exact_ps) < 0.1  # e4m3 and bf16 on a random model (0.038 seen)
    crowded = body(other_questions(200) + TARGETS, [("z", "Other."), ("a", CONTENT)])
    assert numbers(engine.score(crowded)) == numbers(engine.score(targets))  # bitwise, as batch_invariant claims


@pytest.mark.gpu
def test_calibrate_then_serve_picks_fp8s_for_a_bf16_catalog_model(tmp_path, monkeypatch, tiny_engine):
    import torch

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9")
    manifests, root = tmp_path / "manifests", tmp_path / "cache"
    manifests.mkdir()
    (manifests / "tiny-bf16.toml").write_text(BF16_MANIFEST)
    shutil.copytree(tiny_engine.folder, root / "models--acme--tiny-bf16" / "snapshots" / REVISION)
    monkeypatch.setenv("SPINF_MANIFEST_DIRS", str(manifests))
    monkeypatch.setenv("SPINF_CACHE_DIRS", str(root))
    monkeypatch.setenv("SPINF_MODEL", "acme/tiny-bf16")
    calibrate_command(tmp_path, "cuda:0")
    path = store_path("acme/tiny-bf16", REVISION)
    assert json.loads(path.read_text())["environment"]["quant"] == "fp8"
    engine = Engine("acme/tiny-bf16", device="cuda:0")
    assert (engine.quant, engine.scale_table, engine.batch_invariant) == ("fp8s", table_id(path.read_bytes()), True)
