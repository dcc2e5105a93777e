"""Settings: every knob of a deployment, layered, checked and frozen (api spec §9).

``SETTINGS`` is the one table of settings: name, section, kind (parser and checker), default, flags, environment
names and help. The environment reader, the TOML reader, the frozen tree (``Settings``: ``engine``, ``server``,
``features``, ``limits``) and, in ``spinf.settings.flags``, the command-line flags, the origin listing and the TOML
writer all come from it, so a setting cannot exist in one place and be missing in another. ``load_settings`` layers
them, first value wins: command-line flag > environment variable (an empty string counts as unset) > TOML file
(``--config FILE`` or ``SPINF_CONFIG``) > the served model's manifest (engine settings and ``media``) > built-in
default; a higher layer replaces a list. It records where each value came from in ``Settings.origins``
(``flag --port``, ``env SPINF_PORT``, ``config /etc/spinf.toml:12``, ``manifest spinf/gemma-4-12b-fp8``,
``default``). Every value given in any layer is checked, even one a higher layer overrides, and every refusal is a
``ConfigError`` whose one-line message names the dotted setting, where the value came from and what is allowed.

The TOML file has the sections ``[engine]``, ``[server]``, ``[features]`` and ``[limits]``; each key is read only
from its own section, except that the pack keys (``packs``, ``official_packs``, ``packs_allow_namespace``,
``packs_refresh``, ``packs_official``) may also sit in a ``[packs]`` section. Besides the spec's names, two settings
exist only as documented environment names and their TOML keys: ``cache_dirs`` (``SPINF_CACHE_DIRS``,
colon-separated) and ``packs_official`` (``SPINF_PACKS_OFFICIAL``); ``SPINF_ENGINE_TOKEN`` is an extra name for
``trusted_token``, and loses to ``SPINF_TRUSTED_TOKEN`` when both are set.

No setting is accepted and then ignored. A setting whose feature this build does not have yet (none today, see
``_NOT_BUILT``) takes only its default: any other value, in any layer, is refused with ``Setting.not_built`` as the
reason. The reference's engine settings that this design has no use for are
``REMOVED``: each still has its name, so setting it (its flag, ``SPINF_<NAME>`` or its TOML key) refuses the start
with the reason, where any other unknown ``SPINF_*`` variable is not read (docs/configuration.md, "Not settings
here").

``Limits`` and ``Features`` are the plain objects the engine and the request parser take; the ``limits`` section of
the tree is a ``Limits`` and ``FeatureSettings.to_features()`` gives the ``Features``.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable, Iterator, Mapping

import attrs
import tomlkit

from spinf.errors import ConfigError
from spinf.settings.file import ConfigFile, Entry, read_config
from spinf.settings.kinds import MEDIA_KINDS, Integer, Kind, Media, Number, Refused, Switch, Text, Words


def _positive(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{attribute.name} must be an integer greater than 0, got {value!r}")


def _non_negative(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an integer of at least 0, got {value!r}")


@attrs.frozen
class Limits:
    """The ten request limits of spec §9.4, with the hosted service's defaults."""

    max_content_tokens: int = attrs.field(default=4096, validator=_positive)
    max_query_tokens: int = attrs.field(default=256, validator=_positive)
    max_prompts_per_input: int = attrs.field(default=10_000, validator=_positive)
    max_processed_tokens: int = attrs.field(default=2_000_000, validator=_positive)
    max_extractions_per_input: int = attrs.field(default=10, validator=_non_negative)
    max_options: int = attrs.field(default=1000, validator=_positive)
    max_option_tokens: int = attrs.field(default=5, validator=_positive)
    max_frames: int = attrs.field(default=1024, validator=_positive)
    max_audio_seconds: int = attrs.field(default=600, validator=_positive)
    max_image_pixels: int = attrs.field(default=50_000_000, validator=_positive)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(a.name for a in attrs.fields(cls))

    def as_dict(self) -> dict[str, int]:
        return attrs.asdict(self)


@attrs.frozen
class Features:
    """What a server (or a trusted call) switches on: media kinds, extraction, generation."""

    media: frozenset[str] = frozenset(MEDIA_KINDS)
    extraction: bool = True
    generation: bool = True
    # why extraction is off when the model, not a switch, turns it off (the 400's message; "" for a switch)
    extraction_note: str = ""


SECTIONS = ("engine", "server", "features", "limits")
# The issue names a [packs] section while the spec puts these keys in [features]; a file may use either.
PACK_KEYS = frozenset({"packs", "official_packs", "packs_allow_namespace", "packs_refresh", "packs_official"})
DEFAULT_MODEL = "spinf/gemma-4-12b-fp8"
_NOT_A_VALUE = object()


@attrs.frozen
class Setting:
    """One row of the settings table; ``env`` is the canonical variable first, then the documented extra names."""

    name: str
    section: str
    kind: Kind
    default: object
    help: str
    flags: tuple[str, ...] = ()
    env_extra: tuple[str, ...] = ()
    unset: object = _NOT_A_VALUE  # a value that counts as not given at all (port 0)
    secret: bool = False
    # why this build takes only the default, for a setting whose feature comes later: any other value is refused
    not_built: str = ""

    @property
    def env(self) -> tuple[str, ...]:
        return (f"SPINF_{self.name.upper()}", *self.env_extra)

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"

    def parse(self, raw: object, origin: str, *, text: bool) -> object:
        """``raw`` as this setting's value: ``text`` from a flag or a variable, else a native value (TOML, manifest,
        a flag's list or switch), so that ``port = "8000"`` in a file is refused rather than read as text."""
        try:
            value = self.kind.from_text(raw) if text else self.kind.from_value(raw)
        except Refused as exc:
            raise ConfigError(f"{self.key} ({origin}): {exc}; allowed: {self.kind.allowed()}") from None
        if self.not_built and value != self.default:
            raise ConfigError(
                f"{self.key} ({origin}): {self.not_built}; allowed: only the default, {self.literal(self.default)}"
            )
        return value

    def literal(self, value: object) -> str:
        return tomlkit.item(self.kind.to_toml(value)).as_string()


def _row(name: str, section: str, kind: Kind, default: object, help: str, *flags: str, **extra) -> Setting:
    return Setting(name, section, kind, default, help, flags, not_built=_NOT_BUILT.get(name, ""), **extra)


def _limit(name: str, default: int) -> Setting:
    low = 0 if name == "max_extractions_per_input" else 1
    return _row(name, "limits", Integer(low), default, _LIMIT_HELP[name], "--" + name.replace("_", "-"))


_E, _S, _F, _L = SECTIONS
_EXTRA = ("SPINF_ENGINE_TOKEN",)  # the reference's name for the trusted token (spec §9.1)
_QUANTS = ("fp8s", "fp8", "fp8row", "w8a16", "w8a8", "bf16", "f16", "i8")
_QUANT = Text(choices=("", *_QUANTS), aliases={"auto": ""}, what=f"{', '.join(_QUANTS)}, or '' or auto (automatic)")
_DEVICE = Text(pattern=r"cpu|cuda(:\d+)?", what="cpu, cuda or cuda:N")
_LIMIT_HELP = {
    "max_content_tokens": "content tokens per input",
    "max_query_tokens": "tokens of one filled template",
    "max_prompts_per_input": "combinations over all queries of one input",
    "max_processed_tokens": "processed tokens per request",
    "max_extractions_per_input": "extraction slots per input (may be 0)",
    "max_options": "options per query",
    "max_option_tokens": "tokens per option",
    "max_frames": "frames per video",
    "max_audio_seconds": "seconds of audio per part",
    "max_image_pixels": "pixels per image or video frame",
}

# name -> why a setting can only take its default in this build (refused otherwise, see the module docstring)
_NOT_BUILT: dict[str, str] = {}

SETTINGS: tuple[Setting, ...] = (
    _row("model", _E, Text(empty=False), DEFAULT_MODEL, "a catalog id or alias, a checkpoint folder or a Hub id"),
    _row("device", _E, _DEVICE, "cuda:0", "the torch device", "--device"),
    _row("quant", _E, _QUANT, "", "the quantization scheme ('' or auto = automatic)", "--quant"),
    _row("model_dir", _E, Text(), "", "a checkpoint folder, loaded as it is ('' = search)", "--model-dir"),
    _row("token_budget", _E, Integer(1, multiple=128), 16_384, "most tokens in one pass", "--token-budget"),
    _row("max_tokens", _E, Integer(1, multiple=128), 65_536, "the engine's largest input", "--max-tokens"),
    _row("floor_cache", _E, Integer(0), 65_536, "floor reads kept across requests (0 = none)", "--floor-cache"),
    _row("lm_head", _E, Text(choices=("bf16", "f32out", "fp32")), "f32out", "LM-head precision", "--lm-head"),
    _row("compile", _E, Switch(), True, "CUDA graphs for small passes (GPU only)", "--no-compile"),
    _row("warmup", _E, Text(choices=("full", "short", "none")), "full", "warm-up before ready", "--warmup"),
    _row("served_model", _E, Text(), "", "the name served ('' = the model as given)"),
    _row("model_id", _E, Text(), "", "the checkpoint's Hub repo"),
    _row("revision", _E, Text(), "", "the checkpoint's pinned revision"),
    _row("cache_dirs", _E, Words(sep=":"), (), "extra checkpoint roots, searched before $HF_HOME/hub"),
    _row("layers", _E, Integer(0), 0, "load only the first N layers (0 = all)"),
    _row(
        "decode_budget_gib",
        _E,
        Number(0.0, inclusive=False),
        4.0,
        "GiB of keys and values extraction slots may hold before they are decoded early",
    ),
    _row("decoder_budget_gib", _E, Number(0.0, inclusive=False), 4.0, "GiB one decode chunk may use"),
    _row("host", _S, Text(empty=False), "0.0.0.0", "the address to listen on", "--host"),
    _row("port", _S, Integer(0, 65_535), 8000, "the port to listen on (0 counts as unset)", "--port", unset=0),
    _row("token", _S, Text(), "", "the access token ('' = open)", "--token", secret=True),
    _row("trusted_token", _S, Text(), "", "the trusted token", "--trusted-token", env_extra=_EXTRA, secret=True),
    _row("queue", _S, Integer(0), 4, "requests waiting beside the running one", "--queue"),
    _row("max_body_bytes", _S, Integer(1), 2_097_152, "the largest request body", "--max-body-bytes"),
    _row("keepalive_s", _S, Number(0.0, inclusive=False), 30.0, "HTTP keep-alive, in seconds"),
    _row("body_timeout_s", _S, Number(0.0, inclusive=False), 60.0, "seconds a request body may take to arrive"),
    _row("backlog", _S, Integer(1), 2048, "connections the kernel holds before they are accepted"),
    _row("reject_rate", _S, Number(0.0, inclusive=False), 200.0, "429 and 503 answers per second, at most"),
    _row("shutdown_s", _S, Number(0.0, inclusive=False), 30.0, "seconds a shutdown may take, in all"),
    _row("debug", _S, Switch(), False, "engine internals in responses", "--debug"),
    _row("log_format", _S, Text(choices=("text", "json")), "text", "log lines as text or JSON", "--log-format"),
    _row("log_probes", _S, Switch(), False, "access-log the health probes and /metrics", "--log-probes"),
    _row("media", _F, Media(), frozenset(MEDIA_KINDS), "media kinds (default: the model's)", "--media", "--no-media"),
    _row("extraction", _F, Switch(), True, "extraction slots", "--extraction", "--no-extraction"),
    _row("generation", _F, Switch(), True, "generated slots", "--generation", "--no-generation"),
    _row("packs", _F, Words(), (), "pack sources (repeatable)", "--packs"),
    _row("official_packs", _F, Switch(), True, "the official pack source", "--no-official-packs"),
    _row("packs_allow_namespace", _F, Words(), (), "namespaces any source may use", "--packs-allow-namespace"),
    _row("packs_refresh", _F, Switch(), False, "resolve pack tags again at start and reload", "--packs-refresh"),
    _row("packs_official", _F, Text(empty=False), "github:spinfinc/spinf-prompts@0.1.0", "the official source"),
    *(_limit(field.name, field.default) for field in attrs.fields(Limits)),
)
SETTING: Mapping[str, Setting] = types.MappingProxyType({s.name: s for s in SETTINGS})


@attrs.frozen
class Removed:
    """An engine setting of the reference (api spec §9.2) that this server does not take, and why not. Given in any
    layer (its flag, ``SPINF_<NAME>``, its TOML key), it refuses the start with the reason instead of being ignored."""

    name: str
    reason: str
    flags: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return f"SPINF_{self.name.upper()}"

    def refusal(self, origin: str, key: str = "") -> ConfigError:
        return ConfigError(f"{key or 'engine.' + self.name} ({origin}): not a setting of this server: {self.reason}")


_HEAD_ROWS = "the GPU LM head always reads rows in fixed chunks of 128, so a row's bits do not depend on the pass"
_ROW_STABLE = "the kernels give a row the same bits wherever it sits in a pass and whatever the pass's size"
_REMOVED = (
    Removed("stack_options", "the model stacks take no options", ("--stack-options",)),
    Removed("capture_budget_gib", "CUDA graphs are captured when first needed, into one shared memory pool"),
    Removed("x_batched", "every pass packs many jobs; there is no unbatched path"),
    Removed(
        "x_cuda_graphs",
        "CUDA graphs for small passes are on by default on a GPU; --no-compile (compile = false) turns them off",
    ),
    Removed("prefetch", "the engine loop prepares the next pass while the device runs the one launched last"),
    Removed("lm_rows", _HEAD_ROWS),
    Removed("align_jobs", f"jobs are never aligned: {_ROW_STABLE}"),
    Removed("lm_fixed_rows", _HEAD_ROWS),
    Removed("min_stream", f"passes are not padded to a minimum length: {_ROW_STABLE}"),
    Removed(
        "fp8s_monitor_every",
        "there is no fp8s scale monitor (a monitored pass would break batch invariance); out-of-range inputs clip",
    ),
    Removed(
        "deterministic_compile",
        "nothing goes through torch.compile: the GPU path is Triton kernels with fixed configurations",
    ),
)
REMOVED: Mapping[str, Removed] = types.MappingProxyType({gone.name: gone for gone in _REMOVED})
# Spec §9.5: a manifest sets engine defaults and which media kinds the model reads, nothing else.
MANIFEST_KEYS = frozenset(s.name for s in SETTINGS if s.section == _E) | {"media"}


def _field(name: str):
    return attrs.field(default=SETTING[name].default)


@attrs.frozen
class EngineSettings:
    model: str = _field("model")
    device: str = _field("device")
    quant: str = _field("quant")
    model_dir: str = _field("model_dir")
    token_budget: int = _field("token_budget")
    max_tokens: int = _field("max_tokens")
    floor_cache: int = _field("floor_cache")
    lm_head: str = _field("lm_head")
    compile: bool = _field("compile")
    warmup: str = _field("warmup")
    served_model: str = _field("served_model")
    model_id: str = _field("model_id")
    revision: str = _field("revision")
    cache_dirs: tuple[str, ...] = _field("cache_dirs")
    layers: int = _field("layers")
    decode_budget_gib: float = _field("decode_budget_gib")
    decoder_budget_gib: float = _field("decoder_budget_gib")


@attrs.frozen
class ServerSettings:
    host: str = _field("host")
    port: int = _field("port")
    token: str = _field("token")
    trusted_token: str = _field("trusted_token")
    queue: int = _field("queue")
    max_body_bytes: int = _field("max_body_bytes")
    keepalive_s: float = _field("keepalive_s")
    body_timeout_s: float = _field("body_timeout_s")
    backlog: int = _field("backlog")
    reject_rate: float = _field("reject_rate")
    shutdown_s: float = _field("shutdown_s")
    debug: bool = _field("debug")
    log_format: str = _field("log_format")
    log_probes: bool = _field("log_probes")


@attrs.frozen
class FeatureSettings:
    media: frozenset[str] = _field("media")
    extraction: bool = _field("extraction")
    generation: bool = _field("generation")
    packs: tuple[str, ...] = _field("packs")
    official_packs: bool = _field("official_packs")
    packs_allow_namespace: tuple[str, ...] = _field("packs_allow_namespace")
    packs_refresh: bool = _field("packs_refresh")
    packs_official: str = _field("packs_official")

    def to_features(self) -> Features:
        return Features(media=self.media, extraction=self.extraction, generation=self.generation)


_SECTION_CLASSES = {_E: EngineSettings, _S: ServerSettings, _F: FeatureSettings, _L: Limits}


@attrs.frozen
class Settings:
    """The effective settings. ``config`` (the file read, if any) and ``origins`` (setting name, and ``config``, to
    where the value came from) describe where they came from and take no part in equality."""

    engine: EngineSettings = attrs.Factory(EngineSettings)
    server: ServerSettings = attrs.Factory(ServerSettings)
    features: FeatureSettings = attrs.Factory(FeatureSettings)
    limits: Limits = attrs.Factory(Limits)
    config: str | None = attrs.field(default=None, eq=False)
    origins: Mapping[str, str] = attrs.field(factory=lambda: types.MappingProxyType({}), eq=False, repr=False)

    def value(self, name: str) -> object:
        return getattr(getattr(self, SETTING[name].section), name)

    def origin(self, name: str) -> str:
        return self.origins.get(name, "default")


def load_settings(
    flags: Mapping[str, object],
    environ: Mapping[str, str],
    *,
    manifest_defaults: Callable[[str], Mapping[str, object]] | None = None,
) -> Settings:
    """The layered settings. ``flags`` holds only what the user gave (setting name, or ``config``, to the flag's text,
    list or boolean); ``manifest_defaults(model)`` gives the served model's manifest layer once the model is known.

    Raises ``ConfigError`` for any bad value, key, file or combination; ``manifest_defaults`` may raise its own."""
    env = {name: text for name, text in environ.items() if name.startswith("SPINF_") and text != ""}
    _refuse_removed(flags, env)
    config, config_origin = _config_file(flags, env)
    from_file = _file_layer(read_config(config, config_origin)) if config is not None else {}
    model, _ = _pick(SETTING["model"], flags, env, from_file, {})
    manifest = _manifest_layer(str(model), manifest_defaults)
    values, origins = {}, {"config": config_origin}
    for setting in SETTINGS:
        values[setting.name], origins[setting.name] = _pick(setting, flags, env, from_file, manifest)
    sections = {
        section: cls(**{s.name: values[s.name] for s in SETTINGS if s.section == section})
        for section, cls in _SECTION_CLASSES.items()
    }
    return Settings(**sections, config=config, origins=types.MappingProxyType(origins))


Layer = Mapping[str, tuple[object, str]]  # setting name -> (raw value, origin)


def _refuse_removed(flags: Mapping[str, object], env: Mapping[str, str]) -> None:
    for gone in REMOVED.values():
        if gone.name in flags:
            raise gone.refusal(f"flag {gone.flags[0]}")
        if gone.env in env:
            raise gone.refusal(f"env {gone.env}")


def _pick(setting: Setting, flags: Mapping[str, object], env: Mapping[str, str], *lower: Layer) -> tuple:
    """The first layer's value and origin, after checking every layer's value for this setting."""
    chosen = None
    for raw, origin, text in _given(setting, flags, env, lower):
        value = setting.parse(raw, origin, text=text)
        if chosen is None and value != setting.unset:
            chosen = (value, origin)
    return chosen or (setting.default, "default")


def _given(setting: Setting, flags: Mapping[str, object], env: Mapping[str, str], lower) -> Iterator[tuple]:
    """Each layer's ``(raw value, origin, is text)`` for ``setting``, highest layer first."""
    if setting.name in flags:
        raw = flags[setting.name]
        yield raw, _flag_origin(setting, raw), isinstance(raw, str)
    for name in setting.env:
        if name in env:
            yield env[name], f"env {name}", True
    for layer in lower:
        if setting.name in layer:
            yield *layer[setting.name], False


def _flag_origin(setting: Setting, raw: object) -> str:
    if setting.name == "model":
        return "argument MODEL"
    if len(setting.flags) == 2 and (raw is False or raw == ()):
        return f"flag {setting.flags[1]}"  # the negative of a pair: --no-extraction, --no-media
    return f"flag {setting.flags[0]}"


def _config_file(flags: Mapping[str, object], env: Mapping[str, str]) -> tuple[str | None, str]:
    if "config" in flags:
        return str(flags["config"]), "flag --config"
    if "SPINF_CONFIG" in env:
        return env["SPINF_CONFIG"], "env SPINF_CONFIG"
    return None, "default"


def _manifest_layer(model: str, manifest_defaults: Callable[[str], Mapping[str, object]] | None) -> Layer:
    if manifest_defaults is None:
        return {}
    defaults = dict(manifest_defaults(model))
    origin = f"manifest {defaults.get('served_model') or model}"
    stray = sorted(set(defaults) - MANIFEST_KEYS)
    if stray:
        raise ConfigError(
            f"{origin}: sets {stray[0]!r}, which a manifest cannot set; it sets engine settings and media"
        )
    return {name: (value, origin) for name, value in defaults.items()}


def _file_layer(config: ConfigFile) -> Layer:
    """The file's settings by name, once every table and key has been checked against the table of settings."""
    for table in config.tables:
        if table.key not in (*SECTIONS, "packs"):
            raise ConfigError(f"[{table.key}] ({table.origin}): unknown section; the sections are {_SECTIONS_TEXT}")
    found: dict[str, tuple[object, str]] = {}
    for entry in config.entries:
        setting = _setting_of(entry)
        if setting.name in found:
            raise ConfigError(f"{setting.key} ({entry.origin}): set again (first at {found[setting.name][1]})")
        found[setting.name] = (entry.value, entry.origin)
    return found


_SECTIONS_TEXT = "[engine], [server], [features] (or [packs] for the pack keys) and [limits]"


def _setting_of(entry: Entry) -> Setting:
    dotted = f"{entry.section}.{entry.key}" if entry.section else entry.key
    if entry.key in REMOVED:
        raise REMOVED[entry.key].refusal(entry.origin, dotted)
    setting = SETTING.get(entry.key)
    if setting is None:
        near = difflib.get_close_matches(entry.key, SETTING, n=1)
        hint = f"did you mean {SETTING[near[0]].key}? " if near else ""
        takes = [s.name for s in SETTINGS if entry.section in (s.section, "packs" if s.name in PACK_KEYS else "")]
        where = f"[{entry.section}] takes {', '.join(takes)}" if takes else f"keys go in the sections {_SECTIONS_TEXT}"
        raise ConfigError(f"{dotted} ({entry.origin}): unknown key; {hint}{where}")
    allowed = {setting.section, "packs"} if setting.name in PACK_KEYS else {setting.section}
    if entry.section not in allowed:
        found = f"[{entry.section}]" if entry.section else "outside any section"
        raise ConfigError(f"{dotted} ({entry.origin}): {setting.name} belongs in [{setting.section}], not {found}")
    return setting
