"""The repository manifest ``prompt-packs.json`` (packs spec §3): its schema, checked in full, and its parsed form.

`parse_manifest` checks every field and reports an invalid manifest as **one** problem that lists each schema
location (§3: then nothing else in the folder is loaded). Unknown keys are ignored. What the manifest says about the
files it lists (paths that must exist, ids inside the namespace, the files' own content) is
`spinf.packs.repository`'s.
"""

from __future__ import annotations

import json
import re

import attrs

from spinf.packs.problems import Problem, is_int
from spinf.packs.validate import ID_RE, MEDIA

MANIFEST_NAME = "prompt-packs.json"
NAMESPACE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
STATUSES = ("available", "deprecated", "coming_soon")


@attrs.frozen
class ListedVersion:
    version: str
    file: str
    model: str
    status: str
    fixture: str | None
    note: str | None


@attrs.frozen
class ListedPack:
    id: str
    name: str
    description: str
    tags: tuple[str, ...]
    media: tuple[str, ...]
    parameters: tuple[str, ...]
    readme: str | None
    samples: str | None
    versions: tuple[ListedVersion, ...]


@attrs.frozen
class Manifest:
    namespace: str
    name: str
    homepage: str
    license: str
    packs: tuple[ListedPack, ...]


def parse_manifest(text: str) -> Manifest | Problem:
    """The manifest in ``text``, or the one problem that makes it invalid."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return Problem("", f"the repository manifest is not JSON: {exc}", MANIFEST_NAME)
    errors: list[str] = []
    _check(raw, errors)
    if errors:
        return Problem("", "the repository manifest is invalid: " + "; ".join(errors), MANIFEST_NAME)
    return _build(raw)


def _check(raw: object, errors: list[str]) -> None:
    if not isinstance(raw, dict):
        errors.append("the manifest must be a JSON object")
        return
    if not (is_int(raw.get("format")) and raw["format"] == 1):
        errors.append("format: must be 1")
    if not (isinstance(raw.get("namespace"), str) and NAMESPACE_RE.match(raw["namespace"])):
        errors.append("namespace: required, lower case, digits, '.', '_', '-', starting with a letter or digit")
    _strings(raw, ("name", "homepage", "license"), "", errors)
    if not isinstance(raw.get("packs"), list):
        errors.append("packs: a list is required")
        return
    for i, entry in enumerate(raw["packs"]):
        _check_entry(entry, f"packs.{i}", errors)


def _strings(raw: dict, keys: tuple[str, ...], path: str, errors: list[str]) -> None:
    for key in keys:
        if key in raw and not isinstance(raw[key], str):
            errors.append(f"{path}{key}: must be a string")


def _string_list(value: object, allowed: tuple[str, ...] | None = None) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and (allowed is None or v in allowed) for v in value)


def _check_entry(entry: object, path: str, errors: list[str]) -> None:
    if not isinstance(entry, dict):
        errors.append(f"{path}: must be an object")
        return
    if not (isinstance(entry.get("id"), str) and ID_RE.match(entry["id"])):
        errors.append(f"{path}.id: required, a pack id <namespace>/<name>")
    if not isinstance(entry.get("name"), str):
        errors.append(f"{path}.name: required, a string")
    _strings(entry, ("description", "readme", "samples"), f"{path}.", errors)
    if "tags" in entry and not _string_list(entry["tags"]):
        errors.append(f"{path}.tags: must be a list of strings")
    if "media" in entry and not _string_list(entry["media"], MEDIA):
        errors.append(f"{path}.media: must be a list drawn from text, image, audio, video")
    if "parameters" in entry and not _string_list(entry["parameters"]):
        errors.append(f"{path}.parameters: must be a list of parameter names")
    versions = entry.get("versions")
    if not (isinstance(versions, list) and versions):
        errors.append(f"{path}.versions: required, a list of at least one version")
        return
    for j, version in enumerate(versions):
        where = f"{path}.versions.{j}"
        if not isinstance(version, dict):
            errors.append(f"{where}: must be an object")
            continue
        for key in ("version", "file", "model"):
            if not isinstance(version.get(key), str):
                errors.append(f"{where}.{key}: required, a string")
        _strings(version, ("fixture", "note"), f"{where}.", errors)
        if version.get("status", "available") not in STATUSES:
            errors.append(f"{where}.status: one of available, deprecated, coming_soon")


def _build(raw: dict) -> Manifest:
    return Manifest(
        namespace=raw["namespace"],
        name=raw.get("name", ""),
        homepage=raw.get("homepage", ""),
        license=raw.get("license", ""),
        packs=tuple(_entry(entry) for entry in raw["packs"]),
    )


def _entry(entry: dict) -> ListedPack:
    return ListedPack(
        id=entry["id"],
        name=entry["name"],
        description=entry.get("description", ""),
        tags=tuple(entry.get("tags", ())),
        media=tuple(entry.get("media", ("text",))),
        parameters=tuple(entry.get("parameters", ())),
        readme=entry.get("readme"),
        samples=entry.get("samples"),
        versions=tuple(_version(v) for v in entry["versions"]),
    )


def _version(version: dict) -> ListedVersion:
    return ListedVersion(
        version=version["version"],
        file=version["file"],
        model=version["model"],
        status=version.get("status", "available"),
        fixture=version.get("fixture"),
        note=version.get("note"),
    )
