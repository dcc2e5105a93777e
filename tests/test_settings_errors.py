"""Refusals: every bad value, key, section, file or combination is one ``ConfigError`` line naming the dotted
setting, where it came from (flag, variable, ``FILE:LINE``, manifest) and what is allowed."""

from __future__ import annotations

import re

import pytest

from spinf.errors import ConfigError
from spinf.settings import SETTING, SETTINGS, load_settings
from spinf.settings.kinds import Switch

MEDIA_ALLOWED = "image, audio, video (comma-separated), none, or a boolean (true: the model's kinds; false: none)"


def refusal(flags=None, env=None, manifest=None) -> str:
    defaults = (lambda model: manifest) if manifest is not None else None
    with pytest.raises(ConfigError) as info:
        load_settings(flags or {}, env or {}, manifest_defaults=defaults)
    message = str(info.value)
    assert "\n" not in message
    return message


def file_refusal(tmp_path, text: str) -> tuple[str, str]:
    config = tmp_path / "spinf.toml"
    config.write_text(text)
    return refusal({"config": str(config)}), str(config)


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        (
            {"port": "abc"},
            {},
            "server.port (flag --port): 'abc' is not an integer; allowed: an integer from 0 to 65535",
        ),
        (
            {},
            {"SPINF_PORT": "70000"},
            "server.port (env SPINF_PORT): 70000 is out of range; allowed: an integer from 0 to 65535",
        ),
        (
            {},
            {"SPINF_MAX_OPTIONS": "0"},
            "limits.max_options (env SPINF_MAX_OPTIONS): 0 is out of range; allowed: an integer of at least 1",
        ),
        (
            {"max_extractions_per_input": "-1"},
            {},
            "limits.max_extractions_per_input (flag --max-extractions-per-input)"
            ": -1 is out of range; allowed: an integer of at least 0",
        ),
        (
            {"token_budget": "0"},
            {},
            "engine.token_budget (flag --token-budget): 0 is out of range; allowed: an integer "
            "of at least 1, rounded up to a multiple of 128",
        ),
        (
            {},
            {"SPINF_KEEPALIVE_S": "0"},
            "server.keepalive_s (env SPINF_KEEPALIVE_S): 0.0 is out of range; allowed: a number greater than 0",
        ),
        (
            {},
            {"SPINF_SHUTDOWN_S": "nan"},
            "server.shutdown_s (env SPINF_SHUTDOWN_S): nan is not a finite number; allowed: a number greater than 0",
        ),
        (
            {"quant": "int3"},
            {},
            "engine.quant (flag --quant): 'int3' is not one of the choices; allowed: fp8s, fp8, "
            "fp8row, w8a16, w8a8, bf16, f16, i8, or '' or auto (automatic)",
        ),
        ({"device": "gpu0"}, {}, "engine.device (flag --device): 'gpu0' does not fit; allowed: cpu, cuda or cuda:N"),
        (
            {"lm_head": "f16"},
            {},
            "engine.lm_head (flag --lm-head): 'f16' is not one of the choices; allowed: bf16, f32out, fp32",
        ),
        (
            {},
            {"SPINF_WARMUP": "half"},
            "engine.warmup (env SPINF_WARMUP): 'half' is not one of the choices; allowed: full, short, none",
        ),
        (
            {"media": "image,smell"},
            {},
            "features.media (flag --media): 'smell' is not a media kind; allowed: " + MEDIA_ALLOWED,
        ),
        (
            {},
            {"SPINF_MEDIA": "none,audio"},
            "features.media (env SPINF_MEDIA): none cannot be combined with media kinds; allowed: " + MEDIA_ALLOWED,
        ),
        (
            {"media": ""},
            {},
            "features.media (flag --media): it is empty (write none for no media); allowed: " + MEDIA_ALLOWED,
        ),
        ({"host": " "}, {}, "server.host (flag --host): it is empty; allowed: a non-empty string"),
        (
            {},
            {"SPINF_MEDIA_KINDS": "image,smell"},
            "features.media (env SPINF_MEDIA_KINDS): 'smell' is not a media kind; allowed: " + MEDIA_ALLOWED,
        ),
        (
            {},
            {"SPINF_MEDIA": "2"},  # the reference read it as false; here only its booleans and the kinds
            "features.media (env SPINF_MEDIA): '2' is not a media kind; allowed: " + MEDIA_ALLOWED,
        ),
        (
            {},
            {"SPINF_PREFETCH": "abc"},
            "engine.prefetch (env SPINF_PREFETCH): 'abc' is not an integer; allowed: an integer",
        ),
        (
            {},
            {"SPINF_CAPTURE_BUDGET_GIB": "lots"},
            "engine.capture_budget_gib (env SPINF_CAPTURE_BUDGET_GIB): 'lots' is not a number; allowed: a finite "
            "number",
        ),
        (
            {},
            {"SPINF_X_BEAM": "6.5"},
            "engine.x_beam (env SPINF_X_BEAM): '6.5' is not an integer; allowed: an integer",
        ),
    ],
)
def test_a_bad_value_names_the_setting_its_origin_and_what_is_allowed(flags, env, expected):
    assert refusal(flags, env) == expected


def test_a_value_a_higher_layer_overrides_is_still_checked():
    assert refusal({"port": "9000"}, {"SPINF_PORT": "x"}).startswith("server.port (env SPINF_PORT): 'x' is not")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[server]\nport = "9000"\n',
            "server.port ({path}:2): '9000' is not an integer; allowed: an integer from 0 to 65535",
        ),
        (
            "[engine]\n\ncompile = 1\n",
            "engine.compile ({path}:3): 1 is not true or false; allowed: true or false (as "
            "text: 1, true, yes or on for true, anything else for false)",
        ),
        (
            "[features]\npacks = [1, 2]\n",
            "features.packs ({path}:2): [1, 2] is not a list of strings; allowed: a list "
            "of strings (an array, or one string separated by ',')",
        ),
        (
            '[server]\nhost = "h"\nprot = 9000\n',
            "server.prot ({path}:3): unknown key; did you mean server.port? "
            "[server] takes host, port, token, trusted_token, queue, max_body_bytes, keepalive_s, body_timeout_s, "
            "backlog, reject_rate, shutdown_s, debug, log_format, log_probes, allowed_hosts, allowed_origins",
        ),
        (
            "[limits]\nmax_option = 3\n",
            "limits.max_option ({path}:2): unknown key; did you mean limits.max_options? "
            "[limits] takes max_content_tokens, max_query_tokens, max_prompts_per_input, max_processed_tokens, "
            "max_extractions_per_input, max_options, max_option_tokens, max_frames, max_audio_seconds, "
            "max_image_pixels, max_request_pixels",
        ),
        (
            "[engine]\nprefetch = 'six'\n",
            "engine.prefetch ({path}:2): 'six' is not an integer; allowed: an integer",
        ),
        (
            "[features]\nmedia_kinds = ['image', 'smell']\n",
            "features.media ({path}:2): 'smell' is not a media kind; allowed: " + MEDIA_ALLOWED,
        ),
        (
            "[engine]\nload_media = 'maybe'\n",
            "features.media ({path}:2): 'maybe' is not a media kind; allowed: " + MEDIA_ALLOWED,
        ),
        (
            "[sever]\nprot = 9000\n",
            "sever.prot ({path}:2): unknown key; did you mean server.port? keys go in the sections [engine], "
            "[server], [features] (or [packs] for the pack keys) and [limits]",
        ),
        (
            "zzz = 1\n",
            "zzz ({path}:1): unknown key; keys go in the sections [engine], [server], [features] (or "
            "[packs] for the pack keys) and [limits]",
        ),
        (
            "[engine]\n[model]\nname = 'x'\n",
            "model.name ({path}:3): unknown key; keys go in the sections [engine], "
            "[server], [features] (or [packs] for the pack keys) and [limits]",
        ),
        (
            "[engine.extra]\nx = 1\n",
            "engine.extra ({path}:1): unknown key; did you mean features.extraction? [engine] takes model, device, "
            "quant, model_dir, token_budget, max_tokens, floor_cache, max_pass_s, lm_head, compile, warmup, "
            "served_model, model_id, revision, cache_dirs, layers, decode_budget_gib, decoder_budget_gib, "
            "x_cuda_graphs, stack_options, capture_budget_gib, x_batched, prefetch, lm_rows, align_jobs, "
            "lm_fixed_rows, min_stream, fp8s_monitor_every, deterministic_compile, x_beam",
        ),
        (
            "port = 9000\n[server]\nport = 9001\n",
            "server.port ({path}:3): set again (first at {path}:1)",
        ),
        (
            "[features]\nmedia_kinds = ['image']\n[engine]\nmedia_kinds = 'video'\n",
            "features.media_kinds ({path}:4): set again (first at {path}:2)",
        ),
        (
            "[features]\npacks = ['a']\n[packs]\npacks = ['b']\n",
            "features.packs ({path}:4): set again (first at {path}:2)",
        ),
        (
            "[config]\nfile = 'x'\n",
            "config.file ({path}:2): unknown key; keys go in the sections [engine], [server], "
            "[features] (or [packs] for the pack keys) and [limits]",
        ),
    ],
)
def test_a_bad_file_names_the_dotted_key_and_its_line(tmp_path, text, expected):
    message, path = file_refusal(tmp_path, text)
    assert message == expected.format(path=f"config {path}")


@pytest.mark.parametrize(
    ("text", "line"),
    [("[server]\nport = \n", 2), ("[server]\nport = 1\n[server]\n", 3), ('[engine\ndevice = "cpu"\n', 1)],
)
def test_a_malformed_file_is_refused_with_its_line(tmp_path, text, line):
    message, path = file_refusal(tmp_path, text)
    assert re.fullmatch(rf"config {re.escape(path)}:{line} \(flag --config\): not valid TOML: .+", message)


def test_a_duplicate_key_is_malformed_toml(tmp_path):
    message, path = file_refusal(tmp_path, "[server]\nport = 1\nport = 2\n")
    # tomlkit 0.15 names the duplicate's line (3); earlier versions give none, and the message names the file alone
    assert re.match(rf"config {re.escape(str(path))}(:3)? \(flag --config\): not valid TOML: ", message), message
    assert '"port"' in message


def test_a_missing_config_file_names_where_it_was_given(tmp_path):
    missing = tmp_path / "nope.toml"
    assert refusal({}, {"SPINF_CONFIG": str(missing)}) == f"config file {missing} (env SPINF_CONFIG): no such file"


def test_a_manifest_value_is_checked_and_named_by_its_manifest():
    message = refusal(manifest={"served_model": "acme/m", "token_budget": "big"})
    assert message == (
        "engine.token_budget (manifest acme/m): 'big' is not an integer; allowed: an integer of at least 1, rounded "
        "up to a multiple of 128"
    )


def test_a_manifest_may_set_only_engine_settings_and_media():
    assert refusal(manifest={"served_model": "acme/m", "port": 1}) == (
        "manifest acme/m: sets 'port', which a manifest cannot set; it sets engine settings and media"
    )


REFERENCE_NAMES = [
    "stack_options",
    "capture_budget_gib",
    "x_batched",
    "prefetch",
    "lm_rows",
    "align_jobs",
    "lm_fixed_rows",
    "min_stream",
    "fp8s_monitor_every",
    "deterministic_compile",
    "x_beam",
]


def test_the_reference_settings_without_a_knob_here_are_its_engine_settings_and_the_beam():
    """x_cuda_graphs, the twelfth of api spec §9.1's list, is honoured (tests/test_no_inert_settings.py)."""
    assert [s.name for s in SETTINGS if s.no_effect] == REFERENCE_NAMES
    assert not SETTING["x_cuda_graphs"].no_effect


@pytest.mark.parametrize("name", REFERENCE_NAMES)
def test_a_reference_setting_of_the_wrong_type_is_still_refused_in_every_layer(tmp_path, name):
    """No effect here does not mean anything goes: a value the reference could not have read stops the start."""
    setting = SETTING[name]
    if setting.kind.allowed() == "a string":  # stack_options: every string is one
        message, path = file_refusal(tmp_path, f"[engine]\n{name} = 1\n")
        assert message == f"engine.{name} (config {path}:2): 1 is not a string; allowed: a string"
        return
    variable = f"SPINF_{name.upper()}"
    if isinstance(setting.kind, Switch):  # as text every word is a boolean (false unless 1, true, yes or on)
        assert load_settings({}, {variable: "perhaps"}).value(name) is False
    else:
        assert refusal(env={variable: "x"}).startswith(f"engine.{name} (env {variable}): 'x' is not ")
    message, path = file_refusal(tmp_path, f"[engine]\n{name} = 'x'\n")
    assert message.startswith(f"engine.{name} (config {path}:2): 'x' is not ")


def test_an_unknown_spinf_variable_is_still_not_read():
    assert load_settings({}, {"SPINF_NO_SUCH_THING": "1", "SPINF_LOAD_MEDIA": "0"}) == load_settings({}, {})
