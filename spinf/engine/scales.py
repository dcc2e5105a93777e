"""fp8s scale tables (engine spec B.9, api spec §9.8 and §11): where a checkpoint revision's table lives, its id, the
two formats it may be in, and the scales the engine loads from it.

A table is looked up, in this order, at:

1. ``<HF_HOME>/spinf/scales/<org>--<name>/<revision>.json``: the store, where ``spinf-serve calibrate`` writes;
2. ``<HF_HOME>/spinf/scales/tables/<org>__<name>/<revision>.json``: the reference engine's layout inside the store,
   so that its ``quant/tables/`` folder copied to ``<HF_HOME>/spinf/scales/tables/`` is read as it is;
3. ``spinf_serve/quant/tables/<org>__<name>/<revision>.json`` beside an importable ``spinf_serve`` package: where
   the reference engine itself keeps them (its only place; no setting moves it), which also finds the tables its
   ``calibrate`` wrote there and a pip upgrade to this distribution leaves behind;
4. ``spinf_scales.json`` in the checkpoint folder: a table shipped with the weights.

Each may hold either format. Ours (``format: 1``) names the engine's fused linears (``layers.0.wqkv``, ``wo``,
``w_gate_up``, ``w_down``) under ``model``; the reference's has no ``format``, names the checkpoint's projections
(``layers.0.self_attn.q_proj`` ...) under ``model_id``, and is read as the reference reads it: its place decides what
it belongs to, a fused linear takes the largest of its projections' scales (they read the same input, so a
calibration finds them equal), and its ``model_id`` and ``revision`` fields are informative. A table of ours found in
the store must name the checkpoint repo and revision it is found under; a shipped one belongs to its folder and is not
asked to (it cannot name the commit that contains it). Unknown keys are logged once and ignored. A table's id, the
first 10 hex digits of the sha256 of the file's bytes, names it in the system fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
from pathlib import Path

from spinf.errors import ModelError

log = logging.getLogger(__name__)

TABLE_FORMAT = 1
SHIPPED_TABLE = "spinf_scales.json"
REFERENCE_LAYOUT = "tables"  # the folder of the store that holds tables in the reference engine's layout
CALIBRATE_COMMAND = "spinf-serve calibrate --corpus FILE"

# What each format's writer puts in a table; anything else is logged and ignored.
_COMMON_KEYS = ("revision", "scheme", "headroom", "created", "corpus", "amax", "amax_from", "scales")
OUR_KEYS = frozenset(("format", "model", "environment", *_COMMON_KEYS))
REFERENCE_KEYS = frozenset(("model_id", "calibrated_with", *_COMMON_KEYS))
# The Gemma decoder's fused linears (what a table names) and the checkpoint projections each is made of, in order
# (`spinf.engine.gemma4.fp8_static` reads a pre-quantized checkpoint by them); a layer whose keys serve as values has
# no VALUES_PROJECTION.
FUSED_PROJECTIONS = {
    "wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "wo": ("self_attn.o_proj",),
    "w_gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "w_down": ("mlp.down_proj",),
}
VALUES_PROJECTION = "self_attn.v_proj"
# A checkpoint projection's name in the reference's tables (``layers.<i>.<projection>``) -> the engine's fused linear
# it is part of.
_LAYER_PART = re.compile(r"^(layers\.\d+)\.(.+)$")
_FUSED_INTO = {part: fused for fused, parts in FUSED_PROJECTIONS.items() for part in parts}


class ScaleTableMismatch(ModelError):
    """A scale table that does not fit the model it is loaded with (a linear without a scale)."""


def store_root() -> Path:
    """``<HF_HOME>/spinf/scales`` (``HF_HOME`` defaulting to ``huggingface`` in the user's cache folder)."""
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "spinf" / "scales"


def store_path(model_id: str, revision: str, root: str | Path | None = None) -> Path:
    """Where ``spinf-serve calibrate`` writes a checkpoint revision's table: ``<store>/<org>--<name>/<rev>.json``."""
    return Path(root or store_root()) / model_id.replace("/", "--") / f"{revision or 'unpinned'}.json"


def reference_layout_path(tables: str | Path, model_id: str, revision: str) -> Path:
    """A table in the reference engine's layout under the folder ``tables``: ``<org>__<name>/<revision>.json``."""
    return Path(tables) / model_id.replace("/", "__") / f"{revision or 'unpinned'}.json"


def reference_package_tables() -> list[Path]:
    """The reference engine's own table folders, ``spinf_serve/quant/tables``, where a ``spinf_serve`` package (or
    what an uninstall left of it, a namespace package) is importable; found without importing it."""
    try:
        spec = importlib.util.find_spec("spinf_serve")
    except (ImportError, ValueError):
        return []
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return [Path(location) / "quant" / "tables" for location in locations]


def stored_tables(model_id: str, revision: str) -> list[Path]:
    """The places outside the checkpoint where the table of ``model_id`` at ``revision`` may be, in lookup order."""
    paths = [
        store_path(model_id, revision),
        reference_layout_path(store_root() / REFERENCE_LAYOUT, model_id, revision),
    ]
    return paths + [reference_layout_path(tables, model_id, revision) for tables in reference_package_tables()]


def stored_table(model_id: str, revision: str) -> Path | None:
    """The first table of ``model_id`` at ``revision`` found outside the checkpoint, or None."""
    return next((path for path in stored_tables(model_id, revision) if path.is_file()), None)


def table_id(data: bytes) -> str:
    """The id of a table file's bytes: the first 10 hex digits of their sha256."""
    return hashlib.sha256(data).hexdigest()[:10]


def write_table(table: dict, path: str | Path) -> str:
    """Write the table (atomically) and return its id."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(table, indent=1) + "\n").encode()
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)
    return table_id(data)


def find_table(model_id: str, revision: str, folder: str | Path) -> Path | None:
    """The table of ``model_id`` at ``revision``: a stored one (`stored_tables`), else the one shipped in
    ``folder``, else None."""
    shipped = Path(folder) / SHIPPED_TABLE
    return stored_table(model_id, revision) or (shipped if shipped.is_file() else None)


def missing_table_error(name: str, model_id: str, revision: str, folder: str | Path) -> ModelError:
    """The refusal of fp8s without a table: where it looked and the command that makes one."""
    elsewhere = ", ".join(str(path) for path in [*stored_tables(model_id, revision)[1:], Path(folder) / SHIPPED_TABLE])
    return ModelError(
        f"{name}: the fp8s scheme needs a scale table for {model_id} at revision {revision}, and there is none at "
        f"{store_path(model_id, revision)} (nor {elsewhere}). Make one with "
        f"`SPINF_MODEL={name} {CALIBRATE_COMMAND}` under the same settings, or choose another scheme with --quant"
    )


def read_scale_table(name: str, model_id: str, revision: str, folder: str | Path) -> tuple[Path, dict, str]:
    """Find and check the table of a checkpoint revision: its path, its content and its id.

    The content's ``scales`` name the engine's fused linears whatever the file's format (`parse_table`). ``name``
    is the served name the messages use. Raises `ModelError` when there is none or it names another checkpoint
    revision; whether it covers every linear is checked where it is applied (``to_fp8s``).
    """
    path = find_table(model_id, revision, folder)
    if path is None:
        raise missing_table_error(name, model_id, revision, folder)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"the scale table {path} cannot be read: {exc.strerror or exc}") from exc
    table = parse_table(data, path)
    named = (table.get("model"), table.get("revision"))
    if "format" not in table:
        if (table.get("model_id"), table.get("revision")) != (model_id, revision):
            log.warning(
                "the scale table %s (the reference's format) says %s at revision %s; it is read for %s at %s, as "
                "the reference reads it, by where it lies",
                path,
                table.get("model_id"),
                table.get("revision"),
                model_id,
                revision,
            )
    elif path != Path(folder) / SHIPPED_TABLE and named != (model_id, revision):
        raise ModelError(
            f"the scale table {path} is for {named[0]} at revision {named[1]}, not {model_id} at {revision}; "
            f"recalibrate with `SPINF_MODEL={name} {CALIBRATE_COMMAND}`"
        )
    return path, table, table_id(data)


def parse_table(data: bytes, path: str | Path) -> dict:
    """The table in ``data``, in either format, checked for what loading needs, with its ``scales`` under the
    engine's linear names (a reference table's projections fused, `fused_scales`)."""
    try:
        table = json.loads(data)
    except ValueError as exc:
        raise ModelError(f"the scale table {path} is not JSON: {exc}") from exc
    ours = isinstance(table, dict) and "format" in table
    if not isinstance(table, dict) or (ours and table.get("format") != TABLE_FORMAT) or table.get("scheme") != "fp8s":
        raise ModelError(f"the scale table {path} is not an fp8s table of format {TABLE_FORMAT} or the reference's")
    scales = table.get("scales")
    if not isinstance(scales, dict) or not scales or not all(_is_scale(value) for value in scales.values()):
        raise ModelError(f"the scale table {path} has no scales, or a scale that is not a positive number")
    _log_unknown(str(path), tuple(sorted(set(table) - (OUR_KEYS if ours else REFERENCE_KEYS))))
    return table if ours else {**table, "scales": fused_scales(scales, path)}


def fused_scales(projections: dict[str, float], path: str | Path = "") -> dict[str, float]:
    """A reference table's per-projection scales as the engine's fused linears take them: the largest of each
    fused linear's projections. A name that is not a decoder projection is logged once and ignored; a fused linear
    that has some of its projections but not one it needs (all but a v projection) is refused, naming it."""
    fused: dict[str, float] = {}
    parts: dict[tuple[str, str], set[str]] = {}
    unknown = []
    for name, scale in projections.items():
        match = _LAYER_PART.match(name)
        if match is None or match[2] not in _FUSED_INTO:
            unknown.append(name)
            continue
        layer, projection = match.groups()
        linear = f"{layer}.{_FUSED_INTO[projection]}"
        fused[linear] = max(fused.get(linear, 0.0), float(scale))
        parts.setdefault((layer, _FUSED_INTO[projection]), set()).add(projection)
    _log_unknown(f"{path} scales", tuple(sorted(unknown)))
    for (layer, linear), seen in sorted(parts.items()):
        needed = [part for part in FUSED_PROJECTIONS[linear] if part != VALUES_PROJECTION]
        missing = [part for part in needed if part not in seen]
        if missing:
            raise ModelError(
                f"the scale table {path} has no scale for {layer}.{missing[0]}, which the engine runs fused with "
                f"{layer}.{sorted(seen)[0]}"
            )
    return fused


@functools.cache
def _log_unknown(where: str, keys: tuple[str, ...]) -> None:
    """Once per table and set of keys: those this engine does not read."""
    if keys:
        log.warning("%s: ignoring what this engine does not read: %s", where, ", ".join(keys))


def _is_scale(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
