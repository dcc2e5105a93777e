"""Model resolution (api spec §9.6): from the name given at start-up to what is served and how.

`resolve_model` turns a name into a `ResolvedModel`, in the spec's order: a manifest id or alias (compared
case-insensitively; no name means the default catalog model, D1), else an existing local folder, else a Hub repo id
(``org/name``, unpinned, D2). It reads no weights and touches no network; `find_checkpoint` does the lookup. The
architecture of a checkpoint outside the catalog comes from its ``config.json`` (`detect_family`).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import attrs

from spinf.catalog.manifest import CAPABILITIES, MEDIA_KINDS, Catalog, Manifest, load_catalog
from spinf.errors import ModelError
from spinf.settings.table import DEFAULT_MODEL

logger = logging.getLogger(__name__)

REPO_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

# config.json model_type -> family. Only the architectures the engine implements: the Gemma 4 variants with or
# without media towers, and the dense Qwen3.5 hybrid stack (not its MoE variant).
FAMILY_BY_MODEL_TYPE = {
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "gemma4_unified": "gemma4",
    "gemma4_unified_text": "gemma4",
    "qwen3_5": "qwen35",
    "qwen3_5_text": "qwen35",
}


@attrs.frozen
class ResolvedModel:
    """What the start-up name resolved to.

    ``served_name`` is what ``/v1/models`` lists and requests may name: the manifest id, or the name exactly as
    given. ``repo_id`` is the Hub repo (None for a local folder), ``revision`` the pinned commit (None unless a
    manifest pins it), ``local_folder`` the folder given as the model. ``family`` is the architecture to load
    (``gemma4`` or ``qwen35``; None for a Hub repo until its ``config.json`` is read) and ``weight_format`` the
    checkpoint format when known before lookup. Only catalog models are ``batch_invariant``-capable.
    """

    served_name: str
    manifest: Manifest | None
    repo_id: str | None
    revision: str | None
    local_folder: Path | None
    family: str | None
    weight_format: str | None
    batch_invariant: bool

    @property
    def model_id(self) -> str:
        """The checkpoint as the ``model_id`` setting and the fingerprint name it (the local path when no repo)."""
        return self.repo_id if self.repo_id is not None else self.served_name

    @property
    def is_builtin(self) -> bool:
        """Whether the checkpoint is generated locally rather than found or downloaded (the tiny model)."""
        return self.manifest is not None and self.manifest.source.builtin

    @property
    def aliases(self) -> list[str]:
        return list(self.manifest.aliases) if self.manifest else []

    @property
    def capabilities(self) -> list[str]:
        return list(self.manifest.capabilities) if self.manifest else list(CAPABILITIES)

    @property
    def media(self) -> list[str]:
        """The media kinds the model reads (before ``--media``): the manifest's, or every kind without one."""
        return list(self.manifest.media) if self.manifest else list(MEDIA_KINDS)

    @property
    def image(self) -> dict[str, Any] | None:
        """The ``image`` block of ``/v1/models`` (``{"detail_tokens": …}``), only when the manifest has one."""
        if self.manifest is None or self.manifest.image is None:
            return None
        return {"detail_tokens": dict(self.manifest.image.detail_tokens)}

    def listing(self) -> dict[str, Any]:
        """The model's own fields of a ``/v1/models`` entry (§7), before status, limits, features and ``--media``."""
        entry: dict[str, Any] = {
            "id": self.served_name,
            "name": self.manifest.name if self.manifest else self.served_name,
            "base_model": self.manifest.source.repo if self.manifest else self.model_id,
            "aliases": self.aliases,
            "family": self.manifest.family if self.manifest else None,
            "capabilities": self.capabilities,
            "media": self.media,
        }
        if self.image is not None:
            entry["image"] = self.image
        return entry

    def engine_defaults(self) -> dict[str, Any]:
        """The engine settings a manifest sets (§9.5), by setting name; empty without a manifest.

        ``model`` is left out: it is the name being resolved, not a default for it.
        """
        manifest = self.manifest
        if manifest is None:
            return {}
        return {
            "served_model": manifest.id,
            "model_id": manifest.source.repo,
            "revision": manifest.source.revision or "",
            "quant": "" if manifest.quant_default == "auto" else manifest.quant_default,
            "media": list(manifest.media),
            "token_budget": manifest.token_budget,
            "max_tokens": manifest.max_tokens,
        }


def resolve_model(name: str | None, *, catalog: Catalog | None = None) -> ResolvedModel:
    """The model ``name`` means (§9.6), or `ModelError` naming it and listing the catalog's names.

    ``catalog`` defaults to `load_catalog()` (the built-in manifests plus ``SPINF_MANIFEST_DIRS``).
    """
    catalog = load_catalog() if catalog is None else catalog
    name = DEFAULT_MODEL if name is None or name == "" else name
    manifest = catalog.find(name)
    if manifest is not None:
        return _from_manifest(manifest)
    folder = Path(name).expanduser()
    if folder.is_dir():
        config = read_config(folder)
        return ResolvedModel(
            served_name=name,
            manifest=None,
            repo_id=None,
            revision=None,
            local_folder=folder,
            family=detect_family(config, folder / "config.json"),
            weight_format=detect_format(config),
            batch_invariant=False,
        )
    if REPO_ID_PATTERN.match(name):  # looked up (and warned about) by find_checkpoint, refused by check_findable
        return ResolvedModel(
            served_name=name,
            manifest=None,
            repo_id=name,
            revision=None,
            local_folder=None,
            family=None,
            weight_format=None,
            batch_invariant=False,
        )
    raise ModelError(
        f"unknown model {name!r}: it is no catalog id or alias, no existing folder and no Hub repo id (org/name). "
        f"The catalog has: {', '.join(catalog.names())}"
    )


def _from_manifest(manifest: Manifest) -> ResolvedModel:
    if manifest.status != "available":
        raise ModelError(f"model {manifest.id!r} is {manifest.status}, not available yet ({manifest.path})")
    return ResolvedModel(
        served_name=manifest.id,
        manifest=manifest,
        repo_id=manifest.source.repo,
        revision=manifest.source.revision,
        local_folder=None,
        family=manifest.family,
        weight_format=manifest.source.format,
        batch_invariant=True,
    )


def read_config(folder: Path) -> dict[str, Any]:
    """The checkpoint's ``config.json``, or `ModelError` saying why it cannot be read."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ModelError(f"{folder} is no checkpoint folder: it has no config.json") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelError(f"cannot read {path}: {error}") from error
    if not isinstance(config, dict):
        raise ModelError(f"{path} is not a JSON object")
    return config


def detect_family(config: dict[str, Any], where: Path | str) -> str:
    """``gemma4`` or ``qwen35`` from a ``config.json``'s ``model_type``; `ModelError` for any other architecture."""
    model_type = config.get("model_type")
    family = FAMILY_BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        architectures = config.get("architectures")
        raise ModelError(
            f"{where}: unsupported architecture (model_type {model_type!r}, architectures {architectures!r}); "
            f"spinf-serve runs Gemma 4 and Qwen3.5 checkpoints ({', '.join(FAMILY_BY_MODEL_TYPE)})"
        )
    return family


def detect_format(config: dict[str, Any]) -> str:
    """The weight format of a checkpoint outside the catalog, from its ``config.json``.

    A GPTQ quantization config means ``gptq-int4-g32``, compressed-tensors ``fp8-static``, float32 weights
    ``safetensors-f32``; anything else is taken for ``safetensors-bf16``. The loader checks the details. The int4
    name is the manifests' (api spec §9.5) for any group size: the loader reads the group from the config.
    """
    quantization = config.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if method == "gptq":
        return "gptq-int4-g32"
    if method == "compressed-tensors":
        return "fp8-static"
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    dtype = config.get("dtype") or config.get("torch_dtype") or text_config.get("dtype")
    return "safetensors-f32" if dtype == "float32" else "safetensors-bf16"
