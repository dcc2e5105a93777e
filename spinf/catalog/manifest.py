"""Model manifests (api spec §9.5): parsing, the manifest rules, and the catalog they make up.

A manifest is a TOML file describing one served model. The built-in catalog is the ``manifests/`` folder beside
this module; ``SPINF_MANIFEST_DIRS`` (colon-separated) adds folders after it, read in order, each folder's
``*.toml`` files in name order; a later file whose id equals an earlier one's (case-insensitively) replaces it.
Every rule is checked when the catalog loads, and each violation is a `ConfigError` that names the file and the
dotted key.

Beyond the spec's fields, ``[source]`` may say ``builtin = true``: the checkpoint is generated locally, never
downloaded. Only manifests shipped in the package may say so, and only for the tiny model (``spinf/tiny-gemma4``,
whose generator is `spinf.engine.gemma4.tiny`); such a manifest may also use the weight format ``safetensors-f32``,
whose schemes are ``fp32`` (the weights run as they are), which nothing else may, and ``fp8s``. ``[source]`` may also
give ``bytes``, the size of the pinned revision's ``*.safetensors`` files: the start checks whether the weights fit on
the device with it before anything is downloaded (`spinf.engine.opening.check_before_lookup`). Every built-in manifest
gives it; without it, the memory check waits for the files.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from spinf.errors import ConfigError
from spinf.settings.table import DEFAULT_MAX_TOKENS, DEFAULT_TOKEN_BUDGET

logger = logging.getLogger(__name__)

BUILTIN_DIR = Path(__file__).resolve().parent / "manifests"
MANIFEST_DIRS_ENV = "SPINF_MANIFEST_DIRS"

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
REVISION_PATTERN = re.compile(r"^[0-9a-f]{40}$")
# The only checkpoint spinf knows how to generate; it equals spinf.engine.gemma4.tiny.TINY_MODEL_ID (a test checks it),
# spelled out here so that this module does not import torch.
TINY_REPO = "spinf/tiny-gemma4"

STATUSES = ("available", "planned")
FAMILIES = ("gemma4", "qwen35")
HEADS = ("lm_head", "readout")
CAPABILITIES = ("score", "extract", "generate")
PROMPT_STYLES = ("default", "decider")
MEDIA_KINDS = ("image", "audio", "video")
IMAGE_SCHEMES = ("gemma", "qwen")
DETAIL_LEVELS = ("low", "auto", "high")

FP8_SCHEMES = ("fp8s", "fp8", "fp8row")
GEMMA_SCHEMES = (*FP8_SCHEMES, "w8a16", "w8a8", "bf16")
INT4_MODES = ("i8", "f16", "fp8", "bf16")
# The quant schemes each checkpoint format can run (engine spec B.8, B.14.3).
FORMAT_SCHEMES: dict[str, tuple[str, ...]] = {
    "safetensors-bf16": GEMMA_SCHEMES,
    "fp8-static": GEMMA_SCHEMES,
    "gptq-int4-g32": INT4_MODES,
}
# The tiny model's float32 weights run as they are, or in fp8s on a GPU (with a scale table, for the GPU tests).
BUILTIN_FORMAT_SCHEMES: dict[str, tuple[str, ...]] = {"safetensors-f32": ("fp32", "fp8s")}


@attrs.frozen
class Source:
    repo: str
    revision: str | None
    format: str
    builtin: bool = False
    bytes: int | None = None  # the pinned revision's *.safetensors files, when the manifest says


@attrs.frozen
class ImageSpec:
    """The ``[image]`` table: the token scheme, pixels per token block, and tokens per detail level."""

    scheme: str
    side: int
    low: int
    auto: int
    high: int

    @property
    def detail_tokens(self) -> dict[str, int]:
        return {"low": self.low, "auto": self.auto, "high": self.high}


@attrs.frozen
class Manifest:
    id: str
    name: str
    aliases: tuple[str, ...]
    status: str
    family: str
    source: Source
    quant_default: str
    quant_allowed: tuple[str, ...]
    head: str
    capabilities: tuple[str, ...]
    prompt_style: str
    media: tuple[str, ...]
    image: ImageSpec | None
    token_budget: int
    max_tokens: int
    path: Path = attrs.field(eq=False)

    @property
    def names(self) -> tuple[str, ...]:
        """The id and the aliases: every name a request or the command line may use for this model."""
        return (self.id, *self.aliases)


_REQUIRED = object()


class _Table:
    """One TOML table of a manifest: typed reads that raise `ConfigError` naming the file and dotted key."""

    def __init__(self, path: Path, data: dict[str, Any], prefix: str = ""):
        self.path, self.data, self.prefix = path, data, prefix
        self.read: set[str] = set()

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"manifest {self.path}: key {self.prefix}{key}: {problem}")

    def _get(self, key: str, default: Any) -> Any:
        self.read.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                raise self.error(key, "missing")
            return default
        return self.data[key]

    def text(self, key: str, default: Any = _REQUIRED, choices: Sequence[str] | None = None) -> Any:
        value = self._get(key, default)
        if value is default and key not in self.data:
            return value
        if not isinstance(value, str) or not value:
            raise self.error(key, f"must be a non-empty string, not {value!r}")
        if choices is not None and value not in choices:
            raise self.error(key, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def texts(self, key: str, default: Sequence[str], choices: Sequence[str] | None = None) -> tuple[str, ...]:
        value = self._get(key, list(default))
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            raise self.error(key, f"must be a list of non-empty strings, not {value!r}")
        for item in value:
            if choices is not None and item not in choices:
                raise self.error(key, f"{item!r} is not one of {', '.join(choices)}")
        if len(set(value)) != len(value):
            raise self.error(key, f"lists a value twice: {value!r}")
        return tuple(value)

    def integer(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self._get(key, default)
        if key not in self.data:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.error(key, f"must be a positive integer, not {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, not {value!r}")
        return value

    def table(self, key: str, *, required: bool) -> _Table | None:
        value = self._get(key, _REQUIRED if required else None)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table, not {value!r}")
        return _Table(self.path, value, f"{self.prefix}{key}.")

    def refuse_unknown(self) -> None:
        for key in self.data:
            if key not in self.read:
                raise self.error(key, "unknown key")


def parse_manifest(data: dict[str, Any], path: Path, *, builtin_allowed: bool) -> Manifest:
    """The manifest in ``data`` (read from ``path``), or `ConfigError` for the first rule it breaks."""
    top = _Table(path, data)
    manifest_id = top.text("id")
    if not ID_PATTERN.match(manifest_id):
        raise top.error("id", f"{manifest_id!r} does not match {ID_PATTERN.pattern}")
    name = top.text("name")
    aliases = top.texts("aliases", ())
    for alias in aliases:
        if not ID_PATTERN.match(alias):
            raise top.error("aliases", f"{alias!r} does not match {ID_PATTERN.pattern}")
    status = top.text("status", "available", STATUSES)
    family = top.text("family", choices=FAMILIES)
    source = _source(top, status, builtin_allowed=builtin_allowed)
    quant_default, quant_allowed = _quant(top, source)
    head = top.text("head", "lm_head", HEADS)
    capabilities = top.texts("capabilities", CAPABILITIES, CAPABILITIES)
    if not capabilities:
        raise top.error("capabilities", "must name at least one capability")
    if head == "readout" and capabilities != ("score",):
        raise top.error("capabilities", f"a readout head may only score, not {list(capabilities)}")
    prompt_style = top.text("prompt_style", "default", PROMPT_STYLES)
    media = top.texts("media", (), MEDIA_KINDS)
    image = _image(top)
    if image is None and ({"image", "video"} & set(media)):
        raise top.error("image", "an [image] table is required when media has image or video")
    limits = top.table("limits", required=False) or _Table(path, {}, "limits.")
    token_budget = limits.integer("token_budget", DEFAULT_TOKEN_BUDGET)
    max_tokens = limits.integer("max_tokens", DEFAULT_MAX_TOKENS)
    limits.refuse_unknown()
    top.refuse_unknown()
    return Manifest(
        id=manifest_id,
        name=name,
        aliases=aliases,
        status=status,
        family=family,
        source=source,
        quant_default=quant_default,
        quant_allowed=quant_allowed,
        head=head,
        capabilities=capabilities,
        prompt_style=prompt_style,
        media=media,
        image=image,
        token_budget=token_budget,
        max_tokens=max_tokens,
        path=path,
    )


def _source(top: _Table, status: str, *, builtin_allowed: bool) -> Source:
    table = top.table("source", required=True)
    repo = table.text("repo")
    if not ID_PATTERN.match(repo) or "/" not in repo:
        raise table.error("repo", f"{repo!r} is not a Hub repo id (org/name)")
    revision = table.text("revision", None)
    if revision is None and status == "available":
        raise table.error("revision", "required when status is available (a commit, 40 lowercase hex digits)")
    if revision is not None and not REVISION_PATTERN.match(revision):
        raise table.error("revision", f"{revision!r} is not a commit (40 lowercase hex digits)")
    builtin = table.flag("builtin", False)
    if builtin and not builtin_allowed:
        raise table.error("builtin", "only manifests shipped with spinf-serve may be built in")
    if builtin and repo != TINY_REPO:
        raise table.error("builtin", f"spinf can only generate {TINY_REPO}, not {repo!r}")
    formats = {**FORMAT_SCHEMES, **BUILTIN_FORMAT_SCHEMES} if builtin else FORMAT_SCHEMES
    weight_format = table.text("format", choices=tuple(formats))
    num_bytes = table.integer("bytes", None)
    if num_bytes is not None and revision is None:
        raise table.error("bytes", "the size of a checkpoint needs the revision it is the size of")
    table.refuse_unknown()
    return Source(repo=repo, revision=revision, format=weight_format, builtin=builtin, bytes=num_bytes)


def _quant(top: _Table, source: Source) -> tuple[str, tuple[str, ...]]:
    schemes = {**FORMAT_SCHEMES, **BUILTIN_FORMAT_SCHEMES}[source.format]
    table = top.table("quant", required=False) or _Table(top.path, {}, "quant.")
    allowed = table.texts("allowed", schemes, schemes)
    if not allowed:
        raise table.error("allowed", "must name at least one scheme")
    default = table.text("default", "auto")
    if default != "auto" and default not in allowed:
        raise table.error("default", f"{default!r} is neither auto nor one of allowed ({', '.join(allowed)})")
    table.refuse_unknown()
    return default, allowed


def _image(top: _Table) -> ImageSpec | None:
    table = top.table("image", required=False)
    if table is None:
        return None
    scheme = table.text("scheme", choices=IMAGE_SCHEMES)
    side = table.integer("side")
    detail = table.table("detail_tokens", required=True)
    detail_tokens = {level: detail.integer(level) for level in DETAIL_LEVELS}
    detail.refuse_unknown()
    table.refuse_unknown()
    return ImageSpec(scheme=scheme, side=side, **detail_tokens)


def read_manifest(path: Path, *, builtin_allowed: bool = False) -> Manifest:
    """Reads and checks one manifest file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"manifest {path}: cannot be read as TOML: {error}") from error
    return parse_manifest(data, path, builtin_allowed=builtin_allowed)


@attrs.frozen
class Catalog:
    """The manifests in force, and the index of their names (compared case-insensitively)."""

    manifests: tuple[Manifest, ...]
    _by_name: dict[str, Manifest] = attrs.field(repr=False)

    @classmethod
    def of(cls, manifests: Iterable[Manifest]) -> Catalog:
        """The catalog of ``manifests``; `ConfigError` when a name belongs to two of them."""
        manifests = tuple(manifests)
        by_name: dict[str, Manifest] = {}
        for manifest in manifests:
            for key, names in (("id", (manifest.id,)), ("aliases", manifest.aliases)):
                for name in names:
                    owner = by_name.setdefault(name.casefold(), manifest)
                    if owner is not manifest:
                        raise ConfigError(
                            f"manifest {manifest.path}: key {key}: the name {name!r} already belongs to "
                            f"{owner.id!r} ({owner.path}); no name may belong to two manifests"
                        )
        return cls(manifests, by_name)

    def find(self, name: str) -> Manifest | None:
        """The manifest whose id or alias is ``name``, compared case-insensitively."""
        return self._by_name.get(name.casefold())

    def names(self) -> list[str]:
        """Every id and alias, in catalog order."""
        return [name for manifest in self.manifests for name in manifest.names]


def manifest_dirs_from_env() -> list[Path]:
    """The folders of ``SPINF_MANIFEST_DIRS``, in order (empty entries skipped)."""
    return [Path(part).expanduser() for part in os.environ.get(MANIFEST_DIRS_ENV, "").split(":") if part]


def load_catalog(manifest_dirs: Sequence[str | Path] | None = None) -> Catalog:
    """The built-in manifests, then those of ``manifest_dirs`` (default: ``SPINF_MANIFEST_DIRS``), checked.

    A later manifest with the same id (case-insensitively) replaces an earlier one.
    """
    extra = manifest_dirs_from_env() if manifest_dirs is None else [Path(folder) for folder in manifest_dirs]
    by_id: dict[str, Manifest] = {}
    for folder, builtin_allowed in [(BUILTIN_DIR, True), *((folder, False) for folder in extra)]:
        if not folder.is_dir():
            raise ConfigError(f"{MANIFEST_DIRS_ENV}: {folder} is not a folder")
        for path in sorted(folder.glob("*.toml")):
            manifest = read_manifest(path, builtin_allowed=builtin_allowed)
            replaced = by_id.get(manifest.id.casefold())
            if replaced is not None:
                logger.info("manifest %s replaces %s for %s", path, replaced.path, manifest.id)
            by_id[manifest.id.casefold()] = manifest
    return Catalog.of(by_id.values())
