"""Sample values for every setting, and how to give a value in each layer (flag, variable, file, manifest).

``SAMPLES`` holds two different valid values per setting, written by hand from api spec §9.2 and §9.4 rather than
derived from ``spinf.settings``, so a setting added to the table without samples fails the coverage test. The first
value of each pair differs from the built-in default, so a test that finds it knows a layer was read (and a setting
whose feature is not built yet, `Setting.not_built`, refuses it).
"""

from __future__ import annotations

import tomlkit

from spinf.settings import SETTING

SAMPLES: dict[str, tuple[object, object]] = {
    "model": ("acme/high", "acme/low"),
    "device": ("cpu", "cuda:1"),
    "quant": ("fp8row", "bf16"),
    "model_dir": ("/models/high", "/models/low"),
    "token_budget": (8192, 4096),
    "max_tokens": (32768, 16384),
    "floor_cache": (1000, 0),
    "max_pass_s": (2.0, 0.0),
    "lm_head": ("fp32", "bf16"),
    "compile": (False, True),
    "warmup": ("short", "none"),
    "served_model": ("acme/served-high", "acme/served-low"),
    "model_id": ("acme/repo-high", "acme/repo-low"),
    "revision": ("a" * 40, "b" * 40),
    "cache_dirs": (("/c1", "/c2"), ("/c3",)),
    "layers": (2, 4),
    "decode_budget_gib": (1.5, 8.0),
    "decoder_budget_gib": (0.5, 2.0),
    "x_cuda_graphs": (False, True),
    # the reference's engine settings that change nothing here (api spec §9.1): values of the reference's type
    "stack_options": ("gdn_path=levels,fuse_glu=0", "compact=1"),
    "capture_budget_gib": (1.0, 3.5),
    "x_batched": (False, True),
    "prefetch": (2, 8),
    "lm_rows": (512, 2048),
    "align_jobs": (False, True),
    "lm_fixed_rows": (False, True),
    "min_stream": (384, 2048),
    "fp8s_monitor_every": (10, 100),
    "deterministic_compile": (False, True),
    "x_beam": (4, 8),
    "host": ("127.0.0.1", "::1"),
    "port": (9001, 9002),
    "token": ("tok-high", "tok-low"),
    "trusted_token": ("trust-high", "trust-low"),
    "queue": (0, 8),
    "max_body_bytes": (1024, 4096),
    "keepalive_s": (5.5, 60.0),
    "body_timeout_s": (5.0, 90.0),
    "backlog": (128, 4096),
    "reject_rate": (50.0, 500.0),
    "shutdown_s": (10.0, 45.0),
    "debug": (True, False),
    "log_format": ("json", "text"),
    "log_probes": (True, False),
    "allowed_hosts": (("api.example.com",), ("*",)),
    "allowed_origins": (("https://app.example.com",), ("*",)),
    "media": (frozenset({"image"}), frozenset({"audio", "video"})),
    "extraction": (False, True),
    "generation": (False, True),
    "packs": (("github:acme/packs@1", "/local/packs"), ("official",)),
    "official_packs": (False, True),
    "packs_allow_namespace": (("acme", "spinf"), ("other",)),
    "packs_refresh": (True, False),
    "packs_official": ("github:acme/prompts@2", "/checkout"),
    "max_content_tokens": (8192, 2048),
    "max_query_tokens": (512, 128),
    "max_prompts_per_input": (20_000, 500),
    "max_processed_tokens": (4_000_000, 1_000_000),
    "max_extractions_per_input": (0, 3),
    "max_options": (50, 20),
    "max_option_tokens": (8, 3),
    "max_frames": (64, 32),
    "max_audio_seconds": (30, 60),
    "max_image_pixels": (1_000_000, 2_000_000),
    "max_request_pixels": (10_000_000, 20_000_000),
}
MEDIA_ORDER = ("image", "audio", "video")


def native(value: object) -> object:
    """``value`` as TOML or a manifest holds it: lists for tuples and media sets."""
    if isinstance(value, frozenset):
        return [kind for kind in MEDIA_ORDER if kind in value]
    if isinstance(value, tuple):
        return list(value)
    return value


def env_text(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, frozenset):
        return ",".join(native(value)) or "none"
    if isinstance(value, tuple):
        return (":" if name == "cache_dirs" else ",").join(value)
    return str(value)


def flag_argv(name: str, value: object) -> list[str]:
    """The command-line words that give ``value`` to setting ``name`` (a switch's value picks the flag)."""
    flags = SETTING[name].flags
    if name == "model":
        return [value]
    if isinstance(value, bool):
        (flag,) = [f for f in flags if f.startswith("--no-") != value]
        return [flag]
    if isinstance(value, tuple):
        return [word for item in value for word in (flags[0], item)]
    return [flags[0], env_text(name, value)]


def toml_file(section: str, values: dict[str, object]) -> str:
    """A config file with one ``[section]`` table; the first key is on line 2, the next on line 3, and so on."""
    table = tomlkit.table()
    for key, value in values.items():
        table.add(key, native(value))
    document = tomlkit.document()
    document.add(section, table)
    return tomlkit.dumps(document)
