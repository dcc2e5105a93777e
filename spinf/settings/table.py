"""The table of settings (api spec §9.2): each setting's name, section, kind, default, flags, environment names and
help, and the frozen tree they fill (``Settings``: ``engine``, ``server``, ``features``, ``limits``).

Everything else is generated from ``SETTINGS``: the environment and TOML readers and the layering
(``spinf.settings``), the flags, the origin listing and the TOML writer (``spinf.settings.flags``). Defaults live here
only. ``Limits`` and ``Features`` are the plain objects the engine and the request parser take.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import attrs
import tomlkit

from spinf.errors import ConfigError
from spinf.settings.kinds import MEDIA_KINDS, Integer, Kind, Media, Number, Refused, Switch, Text, Words


def _positive(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{attribute.name} must be an integer greater than 0, got {value!r}")


def _non_negative(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an integer of at least 0, got {value!r}")


@attrs.frozen
class Limits:
    """The ten request limits of spec §9.4, with the hosted service's defaults, and our ``max_request_pixels``."""

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
    # ours, beyond §9.4: the pixels of all of a call's images and video frames together, read from their headers
    # before any is decoded (413 request_too_large). 400 million pixels decode in about 5 s of one core.
    max_request_pixels: int = attrs.field(default=400_000_000, validator=_positive)

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
# named, as the model is, for the manifests that leave them out (`spinf.catalog.manifest`) and the benchmarks
DEFAULT_TOKEN_BUDGET = 16_384
DEFAULT_MAX_TOKENS = 65_536
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
    # why a setting of the reference changes nothing here: read and checked, then reported when given
    no_effect: str = ""

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

    def counts(self, raw: object, value: object) -> bool:
        """Whether a value given for this setting chooses it (port 0 and the reference's media true do not)."""
        return value != self.unset and not getattr(self.kind, "defers", lambda raw: False)(raw)


def _row(name: str, section: str, kind: Kind, default: object, help: str, *flags: str, **extra) -> Setting:
    return Setting(name, section, kind, default, help, flags, not_built=_NOT_BUILT.get(name, ""), **extra)


def _reference(name: str, kind: Kind, default: object, reason: str, *flags: str) -> Setting:
    """A setting of the reference's engine that this engine has no knob for (api spec §9.1, drop-in)."""
    help = f"the reference's {name}; no effect here: {reason}"
    return Setting(name, _E, kind, default, help, flags, no_effect=reason)


def _limit(name: str, default: int) -> Setting:
    low = 0 if name == "max_extractions_per_input" else 1
    return _row(name, "limits", Integer(low), default, _LIMIT_HELP[name], "--" + name.replace("_", "-"))


_E, _S, _F, _L = SECTIONS
_EXTRA = ("SPINF_ENGINE_TOKEN",)  # the reference's name for the trusted token (spec §9.1)
_MEDIA_EXTRA = ("SPINF_MEDIA_KINDS",)  # the reference's name for the media kinds (spec §9.1); SPINF_MEDIA wins
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
    "max_request_pixels": "pixels of all of a request's images and video frames",
}

# name -> why a setting can only take its default in this build (refused otherwise, see the module docstring)
_NOT_BUILT: dict[str, str] = {}

# why each reference engine setting without a knob here changes nothing (api spec §9.1, drop-in)
_ROW_STABLE = "the kernels give a row the same bits wherever it sits in a pass and whatever the pass's size"
_HEAD_ROWS = "the GPU LM head always reads rows in fixed chunks of 128, so a row's bits do not depend on the pass"
_CAPTURE = (
    "what one pass keeps for its extraction slots is bounded by decode_budget_gib, which also bounds what waits to "
    "be decoded"
)
_BATCHED = "extraction slots are always branches of their scoring pass, decoded together; there is no one-by-one path"
_PREFETCH = (
    "the engine loop prepares the next pass while the device runs the one launched last (at most two in flight); "
    "there is no queue of packed batches"
)
_MONITOR = "there is no fp8s scale monitor (a monitored pass would break batch invariance); out-of-range inputs clip"
_COMPILE = "nothing goes through torch.compile: the GPU path is Triton kernels with fixed configurations"
_BEAM = "the beam width is fixed at 6, which also caps generate.n (api spec §9.4)"

SETTINGS: tuple[Setting, ...] = (
    _row("model", _E, Text(empty=False), DEFAULT_MODEL, "a catalog id or alias, a checkpoint folder or a Hub id"),
    _row("device", _E, _DEVICE, "cuda:0", "the torch device", "--device"),
    _row("quant", _E, _QUANT, "", "the quantization scheme ('' or auto = automatic)", "--quant"),
    _row("model_dir", _E, Text(), "", "a checkpoint folder, loaded as it is ('' = search)", "--model-dir"),
    _row(
        "token_budget", _E, Integer(1, multiple=128), DEFAULT_TOKEN_BUDGET, "most tokens in one pass", "--token-budget"
    ),
    _row("max_tokens", _E, Integer(1, multiple=128), DEFAULT_MAX_TOKENS, "the engine's largest input", "--max-tokens"),
    _row("floor_cache", _E, Integer(0), 65_536, "floor reads kept across requests (0 = none)", "--floor-cache"),
    _row(
        "max_pass_s",
        _E,
        Number(0.0),
        0.5,
        "seconds one pass of calls may take (0 = the token budget only; default: 0.5 on a CPU, 0 on a GPU)",
        "--max-pass-s",
    ),
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
    _row("x_cuda_graphs", _E, Switch(), True, "extraction decode steps replay CUDA graphs (GPU, with compile)"),
    _reference("stack_options", Text(), "", "the model stacks take no options", "--stack-options"),
    _reference("capture_budget_gib", Number(None), 2.0, _CAPTURE),
    _reference("x_batched", Switch(), True, _BATCHED),
    _reference("prefetch", Integer(None), 6, _PREFETCH),
    _reference("lm_rows", Integer(None), 1024, _HEAD_ROWS),
    _reference("align_jobs", Switch(), True, f"jobs need no alignment: {_ROW_STABLE}"),
    _reference("lm_fixed_rows", Switch(), True, _HEAD_ROWS),
    _reference("min_stream", Integer(None), 1024, f"passes need no minimum length: {_ROW_STABLE}"),
    _reference("fp8s_monitor_every", Integer(None), 0, _MONITOR),
    _reference("deterministic_compile", Switch(), True, _COMPILE),
    _reference("x_beam", Integer(None), 6, _BEAM),
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
    _row(
        "allowed_hosts",
        _S,
        Words(),
        (),
        "Host names answered beside the loopback ones (* = any; default: loopback only on a loopback address)",
        "--allowed-hosts",
    ),
    _row("allowed_origins", _S, Words(), (), "browser Origins allowed (* = any; default: none)", "--allowed-origins"),
    _row(
        "media",
        _F,
        Media(),
        frozenset(MEDIA_KINDS),
        "media kinds (default: the model's); also the reference's booleans, false for none",
        "--media",
        "--no-media",
        env_extra=_MEDIA_EXTRA,
    ),
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


# Spec §9.5: a manifest sets engine defaults and which media kinds the model reads, nothing else.
MANIFEST_KEYS = frozenset(s.name for s in SETTINGS if s.section == _E and not s.no_effect) | {"media"}
# The reference's other TOML names of a setting: name -> (setting, the sections it sits in without a note). Within a
# layer the setting's own key wins, then these in this order.
TOML_EXTRA: Mapping[str, tuple[str, tuple[str, ...]]] = types.MappingProxyType(
    {"media_kinds": ("media", (_F,)), "load_media": ("media", (_E, _F))}
)


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
    max_pass_s: float = _field("max_pass_s")
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
    x_cuda_graphs: bool = _field("x_cuda_graphs")
    stack_options: str = _field("stack_options")
    capture_budget_gib: float = _field("capture_budget_gib")
    x_batched: bool = _field("x_batched")
    prefetch: int = _field("prefetch")
    lm_rows: int = _field("lm_rows")
    align_jobs: bool = _field("align_jobs")
    lm_fixed_rows: bool = _field("lm_fixed_rows")
    min_stream: int = _field("min_stream")
    fp8s_monitor_every: int = _field("fp8s_monitor_every")
    deterministic_compile: bool = _field("deterministic_compile")
    x_beam: int = _field("x_beam")


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
    allowed_hosts: tuple[str, ...] = _field("allowed_hosts")
    allowed_origins: tuple[str, ...] = _field("allowed_origins")


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


SECTION_CLASSES = {_E: EngineSettings, _S: ServerSettings, _F: FeatureSettings, _L: Limits}


@attrs.frozen
class Settings:
    """The effective settings. ``config`` (the file read, if any), ``origins`` (setting name, and ``config``, to
    where the value came from) and ``notes`` (what the start reports about them: a key read outside its section, a
    setting given that has no effect here) describe where they came from and take no part in equality."""

    engine: EngineSettings = attrs.Factory(EngineSettings)
    server: ServerSettings = attrs.Factory(ServerSettings)
    features: FeatureSettings = attrs.Factory(FeatureSettings)
    limits: Limits = attrs.Factory(Limits)
    config: str | None = attrs.field(default=None, eq=False)
    origins: Mapping[str, str] = attrs.field(factory=lambda: types.MappingProxyType({}), eq=False, repr=False)
    notes: tuple[str, ...] = attrs.field(default=(), eq=False, repr=False)

    def value(self, name: str) -> object:
        return getattr(getattr(self, SETTING[name].section), name)

    def origin(self, name: str) -> str:
        return self.origins.get(name, "default")
