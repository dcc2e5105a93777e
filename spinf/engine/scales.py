"""fp8s scale tables (engine spec B.9, api spec §9.8 and §11): where a checkpoint revision's table lives, its id, and
loading it into a model.

A table is looked up first in the store, ``<HF_HOME>/spinf/scales/<org>--<name>/<revision>.json``, where
``spinf-serve calibrate`` writes, then in the checkpoint folder as ``spinf_scales.json`` (a table shipped with the
weights). A stored table must name the checkpoint repo and revision it is found under; a shipped one belongs to its
folder and is not asked to (it cannot name the commit that contains it). A table's id, the first 10 hex digits of
the sha256 of the file's bytes, names it in the system fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from spinf.errors import ModelError

TABLE_FORMAT = 1
SHIPPED_TABLE = "spinf_scales.json"
CALIBRATE_COMMAND = "spinf-serve calibrate --corpus FILE"


class ScaleTableMismatch(ModelError):
    """A scale table that does not fit the model it is loaded with (a linear without a scale)."""


def store_path(model_id: str, revision: str, root: str | Path | None = None) -> Path:
    """Where the table of a checkpoint revision lives: ``<HF_HOME>/spinf/scales/<repo>/<revision>.json``."""
    if root is None:
        home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
        root = Path(home).expanduser() / "spinf" / "scales"
    return Path(root) / model_id.replace("/", "--") / f"{revision or 'unpinned'}.json"


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
    """The table of ``model_id`` at ``revision``: the store's, else the one shipped in ``folder``, else None."""
    for path in (store_path(model_id, revision), Path(folder) / SHIPPED_TABLE):
        if path.is_file():
            return path
    return None


def missing_table_error(name: str, model_id: str, revision: str, folder: str | Path) -> ModelError:
    """The refusal of fp8s without a table: where it looked and the command that makes one."""
    return ModelError(
        f"{name}: the fp8s scheme needs a scale table for {model_id} at revision {revision}, and there is none at "
        f"{store_path(model_id, revision)} (nor {Path(folder) / SHIPPED_TABLE}). Make one with "
        f"`SPINF_MODEL={name} {CALIBRATE_COMMAND}` under the same settings, or choose another scheme with --quant"
    )


def read_scale_table(name: str, model_id: str, revision: str, folder: str | Path) -> tuple[Path, dict, str]:
    """Find and check the table of a checkpoint revision: its path, its content and its id.

    ``name`` is the served name the messages use. Raises `ModelError` when there is none or it names another
    checkpoint revision; whether it covers every linear is checked where it is applied (``to_fp8s``).
    """
    path = find_table(model_id, revision, folder)
    if path is None:
        raise missing_table_error(name, model_id, revision, folder)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"the scale table {path} cannot be read: {exc.strerror or exc}") from exc
    table = _parse_table(data, path)
    if path != Path(folder) / SHIPPED_TABLE and (table.get("model"), table.get("revision")) != (model_id, revision):
        raise ModelError(
            f"the scale table {path} is for {table.get('model')} at revision {table.get('revision')}, not "
            f"{model_id} at {revision}; recalibrate with `SPINF_MODEL={name} {CALIBRATE_COMMAND}`"
        )
    return path, table, table_id(data)


def _parse_table(data: bytes, path: Path) -> dict:
    """The table in ``data``, checked for what loading needs: its format, scheme and scales."""
    try:
        table = json.loads(data)
    except ValueError as exc:
        raise ModelError(f"the scale table {path} is not JSON: {exc}") from exc
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT or table.get("scheme") != "fp8s":
        raise ModelError(f"the scale table {path} is not an fp8s table of format {TABLE_FORMAT}")
    scales = table.get("scales")
    if not isinstance(scales, dict) or not all(_is_scale(value) for value in scales.values()):
        raise ModelError(f"the scale table {path} has no scales, or a scale that is not a positive number")
    return table


def _is_scale(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
