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
