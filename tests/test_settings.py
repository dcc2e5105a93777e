"""Layering of every setting (flag > SPINF_* variable > TOML file > manifest > default) and the value rules of
api spec §9.1: extra names, empty variables, booleans, lists, rounding, port 0."""

from __future__ import annotations

import attrs
import pytest

from spinf.cli import _parser
from spinf.errors import ConfigError
from spinf.settings import (
    MANIFEST_KEYS,
    SECTIONS,
    SETTING,
    SETTINGS,
    EngineSettings,
    Features,
    FeatureSettings,
    Limits,
    ServerSettings,
    Settings,
    load_settings,
)
from spinf.settings.flags import flags_from_args
from spinf.settings.kinds import Words
from tests.settings_samples import SAMPLES, env_text, flag_argv, native, toml_file

LAYERS = ("flag", "env", "file", "manifest")


def cli_flags(argv: list[str]) -> dict[str, object]:
    return flags_from_args(_parser().parse_args(["config", *argv]))


class Manifest:
    """A fake ``manifest_defaults`` that records the model it was asked about."""

    def __init__(self, values: dict[str, object]):
        self.values = values
        self.asked: list[str] = []

    def __call__(self, model: str) -> dict[str, object]:
        self.asked.append(model)
        return self.values


def layered(name: str, top: str, tmp_path) -> tuple[Settings, str]:
    """Settings with ``top`` giving the first sample of ``name`` and every lower layer (not the default) the second.
    Returns them and the origin the top layer should have."""
    setting = SETTING[name]
    high, low = SAMPLES[name]
    below = LAYERS[LAYERS.index(top) :]
    value = {layer: (high if layer == top else low) for layer in below}
    flags = cli_flags(flag_argv(name, value["flag"])) if "flag" in value else {}
    if name == "model_id":  # with a model named, model_id overrides the manifest's (without one it names the model)
        flags["model"] = "acme/named"
    env = {setting.env[0]: env_text(name, value["env"])} if "env" in value else {}
    config = tmp_path / "spinf.toml"
    if "file" in value:
        config.write_text(toml_file(setting.section, {name: value["file"]}))
        env["SPINF_CONFIG"] = str(config)
    manifest = {"served_model": "acme/manifest"}
    if "manifest" in value and name in MANIFEST_KEYS:
        manifest[name] = native(value["manifest"])
    settings = load_settings(flags, env, manifest_defaults=Manifest(manifest))
    if top == "flag":
        return settings, "argument MODEL" if name == "model" else f"flag {flag_argv(name, high)[0]}"
    origin = {
        "env": f"env {setting.env[0]}",
        "file": f"config {config}:2",
        "manifest": f"manifest {manifest['served_model']}",
    }
    return settings, origin[top]


def layer_cases(*, built: bool = True) -> list:
    """(setting, layer) for every layer that can give the setting; ``built`` False: the settings whose feature is
    not built yet, which take only their default."""
    cases = []
    for setting in SETTINGS:
        if bool(setting.not_built) == built:
            continue
        for layer in LAYERS:
            if (layer == "flag" and not setting.flags and setting.name != "model") or (
                layer == "manifest" and setting.name not in MANIFEST_KEYS
            ):
                continue
            cases.append(pytest.param(setting.name, layer, id=f"{setting.name}-{layer}"))
    return cases


@pytest.mark.parametrize(("name", "top"), layer_cases())
def test_the_highest_layer_given_wins(name, top, tmp_path):
    settings, origin = layered(name, top, tmp_path)
    assert (settings.value(name), settings.origin(name)) == (SAMPLES[name][0], origin)


@pytest.mark.parametrize(("name", "top"), layer_cases(built=False))
def test_a_setting_whose_feature_is_not_built_takes_only_its_default(name, top, tmp_path, monkeypatch):
    """Any other value, in any layer, refuses the start with the reason; the default is read (from that layer)."""
    setting, sample = SETTING[name], SAMPLES[name][0]
    monkeypatch.setitem(SAMPLES, name, (sample, setting.default))  # the layers below give the default
    with pytest.raises(ConfigError) as refused:
        layered(name, top, tmp_path)
    origin = {"env": f"env {setting.env[0]}", "file": f"config {tmp_path / 'spinf.toml'}:2"}.get(top)
    origin = origin or f"flag {flag_argv(name, sample)[0]}"
    default = setting.literal(setting.default)
    assert str(refused.value) == f"{setting.key} ({origin}): {setting.not_built}; allowed: only the default, {default}"
    # no flag gives an empty list or a switch's default, and an empty variable counts as unset
    if {"flag": setting.section == "limits", "env": env_text(name, setting.default) != ""}.get(top, True):
        monkeypatch.setitem(SAMPLES, name, (setting.default, setting.default))
        settings, origin = layered(name, top, tmp_path)
        assert (settings.value(name), settings.origin(name)) == (setting.default, origin)


def test_every_setting_is_built():
    # the media limits were the last (issue 16); a setting whose feature is missing again goes in _NOT_BUILT
    assert [s.name for s in SETTINGS if s.not_built] == []


@pytest.mark.parametrize("name", list(SETTING))
def test_with_nothing_given_the_default_applies(name):
    settings = load_settings({}, {}, manifest_defaults=Manifest({}))
    assert (settings.value(name), settings.origin(name)) == (SETTING[name].default, "default")
    assert SAMPLES[name][0] != SETTING[name].default


def test_every_setting_has_samples_and_a_field_in_its_section():
    assert set(SAMPLES) == set(SETTING)
    for section, cls in zip(SECTIONS, (EngineSettings, ServerSettings, FeatureSettings, Limits), strict=True):
        assert [f.name for f in attrs.fields(cls)] == [s.name for s in SETTINGS if s.section == section]


def test_the_defaults_are_the_spec_defaults():
    settings = Settings()
    assert settings == load_settings({}, {})
    assert (settings.engine.model, settings.engine.device, settings.engine.lm_head) == (
        "spinf/gemma-4-12b-fp8",
        "cuda:0",
        "f32out",
    )
    assert (settings.server.port, settings.server.queue, settings.server.max_body_bytes) == (8000, 4, 2_097_152)
    assert settings.features.to_features() == Features()
    assert settings.limits == Limits()


def test_the_manifest_is_asked_about_the_model_the_higher_layers_chose(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(toml_file("engine", {"model": "from-file"}))
    for flags, env, expected in (
        ({}, {}, "spinf/gemma-4-12b-fp8"),
        ({}, {"SPINF_CONFIG": str(config)}, "from-file"),
        ({}, {"SPINF_CONFIG": str(config), "SPINF_MODEL": "from-env"}, "from-env"),
        ({"model": "from-flag"}, {"SPINF_CONFIG": str(config), "SPINF_MODEL": "from-env"}, "from-flag"),
    ):
        manifest = Manifest({})
        load_settings(flags, env, manifest_defaults=manifest)
        assert manifest.asked == [expected]


def test_engine_token_is_an_extra_name_for_the_trusted_token_and_the_canonical_name_wins():
    only_extra = load_settings({}, {"SPINF_ENGINE_TOKEN": "old"})
    assert (only_extra.server.trusted_token, only_extra.origin("trusted_token")) == ("old", "env SPINF_ENGINE_TOKEN")
    both = load_settings({}, {"SPINF_ENGINE_TOKEN": "old", "SPINF_TRUSTED_TOKEN": "new"})
    assert (both.server.trusted_token, both.origin("trusted_token")) == ("new", "env SPINF_TRUSTED_TOKEN")


def test_documented_environment_names():
    settings = load_settings(
        {},
        {
            "SPINF_MAX_OPTIONS": "12",
            "SPINF_MAX_TOKENS": "1000",
            "SPINF_CACHE_DIRS": "/a/b:/c::",
            "SPINF_PACKS_OFFICIAL": "/checkout/spinf-prompts",
            "SPINF_MEDIA": "image,video",
        },
    )
    assert settings.limits.max_options == 12
    assert settings.engine.max_tokens == 1024  # an engine setting, rounded up to a multiple of 128
    assert settings.engine.cache_dirs == ("/a/b", "/c")
    assert (settings.features.packs_official, settings.origin("packs_official")) == (
        "/checkout/spinf-prompts",
        "env SPINF_PACKS_OFFICIAL",
    )
    assert settings.features.media == frozenset({"image", "video"})  # the kinds, not a boolean (D3)


def test_an_empty_variable_counts_as_unset(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(toml_file("server", {"host": "10.0.0.1"}))
    env = {name: "" for setting in SETTINGS for name in setting.env} | {"SPINF_CONFIG": str(config)}
    settings = load_settings({}, env)
    assert (settings.server.host, settings.origin("host")) == ("10.0.0.1", f"config {config}:2")
    assert settings == load_settings({}, {"SPINF_CONFIG": str(config)})
    assert load_settings({}, {"SPINF_CONFIG": ""}).config is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("On", True),
        ("0", False),
        ("no", False),
        ("off", False),
        ("nope", False),
    ],
)
def test_environment_booleans(text, expected):
    assert load_settings({}, {"SPINF_LOG_PROBES": text}).server.log_probes is expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [(1, 128), (128, 128), (129, 256), (1000, 1024), (16_384, 16_384)],
)
def test_token_budget_and_max_tokens_round_up_to_a_multiple_of_128(given, expected):
    settings = load_settings({"token_budget": str(given)}, {"SPINF_MAX_TOKENS": str(given)})
    assert (settings.engine.token_budget, settings.engine.max_tokens) == (expected, expected)


def test_port_0_counts_as_unset_in_every_layer(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(toml_file("server", {"port": 0}))
    assert load_settings({"port": "0"}, {"SPINF_PORT": "9100"}).server.port == 9100
    settings = load_settings({"port": "0"}, {"SPINF_PORT": "0", "SPINF_CONFIG": str(config)})
    assert (settings.server.port, settings.origin("port")) == (8000, "default")


def test_toml_lists_may_be_arrays_or_separated_strings(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[engine]\ncache_dirs = "/a:/b"\n[features]\npacks = []\nmedia = "audio,image"\n')
    settings = load_settings({"config": str(config)}, {})
    assert (settings.engine.cache_dirs, settings.features.media) == (("/a", "/b"), frozenset({"audio", "image"}))
    assert settings.origin("packs") == f"config {config}:4"
    assert Words().from_value("a, b,c") == Words().from_value(["a", "b", "c"]) == ("a", "b", "c")


def test_a_higher_layer_replaces_a_list_rather_than_merging(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(toml_file("engine", {"cache_dirs": ["/a", "/b"]}))
    settings = load_settings({}, {"SPINF_CACHE_DIRS": "/c", "SPINF_CONFIG": str(config)})
    assert settings.engine.cache_dirs == ("/c",)


def test_a_flag_value_is_one_list_item_even_with_a_comma():
    assert cli_flags(["--packs", "/odd,name", "--packs", "b"]) == {"packs": ["/odd,name", "b"]}


def test_pack_keys_may_sit_in_a_packs_section(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[packs]\npacks = []\nofficial_packs = false\npacks_refresh = false\n")
    settings = load_settings({"config": str(config)}, {})
    assert (settings.features.official_packs, settings.origin("official_packs")) == (False, f"config {config}:3")
    assert settings.origin("packs_refresh") == f"config {config}:4"


@pytest.mark.parametrize(
    ("argv", "media", "origin"),
    [
        (["--no-media"], frozenset(), "flag --no-media"),
        (["--media", "none"], frozenset(), "flag --media"),
        (["--media", "video, image"], frozenset({"image", "video"}), "flag --media"),
        (["--media", "image", "--no-media"], frozenset(), "flag --no-media"),  # last one wins, as argparse does
    ],
)
def test_no_media_is_media_none(argv, media, origin):
    settings = load_settings(cli_flags(argv), {"SPINF_MEDIA": "audio"})
    assert (settings.features.media, settings.origin("media")) == (media, origin)
    assert settings.features.to_features() == Features(media=media)


def test_extraction_and_generation_flags_come_in_pairs():
    on = load_settings(cli_flags(["--extraction", "--generation"]), {"SPINF_EXTRACTION": "0", "SPINF_GENERATION": "0"})
    assert (on.features.extraction, on.origin("extraction")) == (True, "flag --extraction")
    assert on.features.generation is True
    off = load_settings(cli_flags(["--no-extraction"]), {})
    assert (off.features.extraction, off.origin("extraction")) == (False, "flag --no-extraction")


def test_quant_auto_means_the_automatic_choice():
    assert load_settings({"quant": "auto"}, {}).engine.quant == ""
    assert load_settings({}, {"SPINF_QUANT": "fp8s"}).engine.quant == "fp8s"


def test_a_manifest_layer_takes_the_catalog_s_shape():
    defaults = {
        "served_model": "spinf/pplx-decider-v1-27b-int4",
        "model_id": "spinf/pplx-decider-v1-27b-int4",
        "revision": "5579a6ec32478b65920cb2a1d9fd23349fb51699",
        "quant": "",
        "media": [],
        "token_budget": 16_384,
        "max_tokens": 16_384,
    }
    settings = load_settings({"model": "decider"}, {}, manifest_defaults=Manifest(defaults))
    assert settings.engine.model == "decider"  # the name as given; the served name comes from the manifest
    assert settings.engine.served_model == "spinf/pplx-decider-v1-27b-int4"
    assert (settings.features.media, settings.origin("media")) == (frozenset(), "manifest " + defaults["model_id"])
    assert settings.engine.max_tokens == 16_384


# The reference's names (api spec §9.1, "The reference's names work too (drop-in)")


def file_settings(tmp_path, text: str, env: dict | None = None, manifest=None) -> tuple[Settings, str]:
    config = tmp_path / "server.toml"
    config.write_text(text)
    defaults = Manifest(manifest) if manifest is not None else None
    return load_settings({}, {"SPINF_CONFIG": str(config), **(env or {})}, manifest_defaults=defaults), str(config)


@pytest.mark.parametrize(
    ("text", "media"),
    [
        ('[features]\nmedia_kinds = ["image", "video"]\n', {"image", "video"}),  # the product documentation's example
        ('[features]\nmedia_kinds = "audio, image"\n', {"audio", "image"}),
        ("[features]\nmedia_kinds = []\n", set()),
        ('[features]\nmedia_kinds = "none"\n', set()),
        ("[engine]\nload_media = false\n", set()),
        ("[engine]\nload_media = true\n", {"image", "audio", "video"}),
        ('[engine]\nload_media = ["video"]\n', {"video"}),
    ],
)
def test_media_kinds_and_load_media_are_toml_names_of_the_media_kinds(tmp_path, text, media):
    settings, path = file_settings(tmp_path, text)
    assert settings.features.media == frozenset(media)
    assert settings.origin("media") == (f"config {path}:2" if text != "[engine]\nload_media = true\n" else "default")
    assert settings.notes == ()  # each in the section the reference documents it in


@pytest.mark.parametrize(("text", "media"), [("0", set()), ("false", set()), ("NO", set()), ("off", set())])
def test_spinf_media_takes_the_reference_s_false(text, media):
    settings = load_settings({}, {"SPINF_MEDIA": text})
    assert (settings.features.media, settings.origin("media")) == (frozenset(media), "env SPINF_MEDIA")
    assert settings.features.to_features().media == frozenset()  # no kind: the embedders are not loaded


@pytest.mark.parametrize("text", ["1", "true", "Yes", "on"])
def test_spinf_media_true_is_every_kind_the_model_reads_and_chooses_none_of_its_own(text, tmp_path):
    alone = load_settings({}, {"SPINF_MEDIA": text}, manifest_defaults=Manifest({"media": ["image", "video"]}))
    assert alone.features.media == frozenset({"image", "video"})  # the manifest's: what the model reads
    assert load_settings({}, {"SPINF_MEDIA": text}).features.media == frozenset({"image", "audio", "video"})
    # beside media_kinds (lower layer or not), true leaves the kinds to it, as the reference's two settings did
    narrowed, path = file_settings(tmp_path, '[features]\nmedia_kinds = ["audio"]\n', env={"SPINF_MEDIA": text})
    assert (narrowed.features.media, narrowed.origin("media")) == (frozenset({"audio"}), f"config {path}:2")
    assert load_settings({}, {"SPINF_MEDIA": text, "SPINF_MEDIA_KINDS": "video"}).features.media == {"video"}


def test_spinf_media_kinds_is_an_extra_name_and_the_canonical_name_wins():
    only_extra = load_settings({}, {"SPINF_MEDIA_KINDS": "image,audio"})
    assert (only_extra.features.media, only_extra.origin("media")) == ({"image", "audio"}, "env SPINF_MEDIA_KINDS")
    both = load_settings({}, {"SPINF_MEDIA_KINDS": "image,audio", "SPINF_MEDIA": "video"})
    assert (both.features.media, both.origin("media")) == ({"video"}, "env SPINF_MEDIA")
    off = load_settings({}, {"SPINF_MEDIA_KINDS": "image", "SPINF_MEDIA": "0"})  # the embedders off: no kind at all
    assert (off.features.media, off.origin("media")) == (frozenset(), "env SPINF_MEDIA")
    assert load_settings(cli_flags(["--media", "audio"]), {"SPINF_MEDIA_KINDS": "image"}).features.media == {"audio"}


def test_in_a_file_media_wins_over_media_kinds_which_wins_over_load_media(tmp_path):
    text = '[engine]\nload_media = false\n[features]\nmedia_kinds = ["image"]\nmedia = ["video"]\n'
    settings, path = file_settings(tmp_path, text)
    assert (settings.features.media, settings.origin("media")) == ({"video"}, f"config {path}:5")
    settings, path = file_settings(tmp_path, text.replace('media = ["video"]\n', ""))
    assert (settings.features.media, settings.origin("media")) == ({"image"}, f"config {path}:4")
    settings, path = file_settings(tmp_path, "[engine]\nload_media = false\n", env={"SPINF_MEDIA_KINDS": "audio"})
    assert settings.features.media == {"audio"}  # a higher layer wins, whatever its name


def test_a_known_key_outside_its_section_is_read_with_one_note_naming_its_section(tmp_path):
    text = (
        'device = "cpu"\n'  # top level, as the reference reads it
        "max_options = 16\n"
        "[engine]\n"
        "port = 9100\n"
        "media_kinds = ['image']\n"
        "[packs]\n"
        "queue = 2\n"
        "[sever]\n"  # any table: the reference flattens them all
        "debug = true\n"
    )
    settings, path = file_settings(tmp_path, text)
    assert (settings.engine.device, settings.origin("device")) == ("cpu", f"config {path}:1")
    assert (settings.limits.max_options, settings.server.port, settings.server.queue) == (16, 9100, 2)
    assert (settings.features.media, settings.server.debug) == ({"image"}, True)
    at = f"config {path}"
    assert settings.notes == (
        f"device ({at}:1): read as engine.device, but it belongs in [engine], not outside any section",
        f"max_options ({at}:2): read as limits.max_options, but it belongs in [limits], not outside any section",
        f"engine.port ({at}:4): read as server.port, but it belongs in [server], not [engine]",
        f"engine.media_kinds ({at}:5): read as features.media, but it belongs in [features], not [engine]",
        f"packs.queue ({at}:7): read as server.queue, but it belongs in [server], not [packs]",
        f"sever.debug ({at}:9): read as server.debug, but it belongs in [server], not [sever]",
    )


@pytest.mark.parametrize("name", [s.name for s in SETTINGS if s.no_effect])
def test_a_reference_setting_without_a_knob_here_is_read_in_every_layer_and_noted(name, tmp_path):
    setting, high = SETTING[name], SAMPLES[name][0]
    for top in ("flag", "env", "file") if setting.flags else ("env", "file"):
        settings, origin = layered(name, top, tmp_path)
        assert (settings.value(name), settings.origin(name)) == (high, origin)
        literal = setting.literal(high)
        note = f"engine.{name} = {literal} ({origin}): no effect on this engine: {setting.no_effect}"
        assert settings.notes == (note,)
    # given at the default (a reference deployment writes its defaults out), still one note; not given, none
    default = setting.literal(setting.default)
    settings, path = file_settings(tmp_path, f"[engine]\n{name} = {default}\n")
    assert settings.notes == (
        f"engine.{name} = {default} (config {path}:2): no effect on this engine: {setting.no_effect}",
    )
    assert load_settings({}, {}).notes == ()
    assert name not in MANIFEST_KEYS


def test_model_id_with_no_model_given_names_the_model_to_serve(tmp_path):
    catalog = {"served_model": "spinf/gemma-4-12b-fp8", "model_id": "spinf/gemma-4-12b-fp8", "media": []}
    manifest = Manifest(catalog)
    settings = load_settings({}, {"SPINF_MODEL_ID": "google/gemma-4-12B"}, manifest_defaults=manifest)
    assert manifest.asked == ["google/gemma-4-12B"]  # resolved as any model name: here a catalog alias
    assert (settings.engine.model, settings.origin("model")) == ("google/gemma-4-12B", "env SPINF_MODEL_ID")
    # the manifest it resolved to sets model_id, as for any catalog model (the scale-table store's key)
    assert (settings.engine.model_id, settings.origin("model_id")) == (
        "spinf/gemma-4-12b-fp8",
        "manifest spinf/gemma-4-12b-fp8",
    )
    hub = load_settings({}, {"SPINF_MODEL_ID": "acme/checkpoint"}, manifest_defaults=Manifest({}))
    assert (hub.engine.model, hub.engine.model_id, hub.origin("model_id")) == ("acme/checkpoint", "", "default")
    in_file, path = file_settings(tmp_path, '[engine]\nmodel_id = "acme/checkpoint"\n')
    assert (in_file.engine.model, in_file.origin("model")) == ("acme/checkpoint", f"config {path}:2")


def test_model_id_beside_a_model_overrides_the_manifest_s(tmp_path):
    for flags, env in (({"model": "spinf-12b"}, {}), ({}, {"SPINF_MODEL": "spinf-12b"})):
        manifest = Manifest({"served_model": "spinf/gemma-4-12b-fp8", "model_id": "spinf/gemma-4-12b-fp8"})
        settings = load_settings(flags, {**env, "SPINF_MODEL_ID": "acme/own"}, manifest_defaults=manifest)
        assert manifest.asked == ["spinf-12b"]
        assert (settings.engine.model, settings.engine.model_id) == ("spinf-12b", "acme/own")
    named, _ = file_settings(tmp_path, '[engine]\nmodel = "tiny"\nmodel_id = "acme/own"\n', manifest={})
    assert (named.engine.model, named.engine.model_id) == ("tiny", "acme/own")
    assert load_settings({}, {}, manifest_defaults=Manifest({})).engine.model == "spinf/gemma-4-12b-fp8"
