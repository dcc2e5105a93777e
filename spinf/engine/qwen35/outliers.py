"""The ``i8`` mode's outlier table of an int4 Qwen3.5 checkpoint (engine spec B.14.3): where it is looked up, the two
formats it is read in, and what is checked.

**Lookup**, in spinf-serve 0.1.1's order: `OUTLIERS_FILE` in the checkpoint folder (the published checkpoints ship
it there), else the checkpoint revision's table beside where its fp8s scale table may be (`revision_tables`, in
order):

1. ``<HF_HOME>/spinf/scales/<org>--<name>/<revision>-outliers.json``: the scale-table store;
2. ``<HF_HOME>/spinf/scales/tables/<org>__<name>/<revision>-outliers.json``: the reference's layout inside the
   store, so that its ``quant/tables/`` folder copied there is read as it is;
3. ``spinf_serve/quant/tables/<org>__<name>/<revision>-outliers.json`` in each folder of an importable
   ``spinf_serve`` package: where the reference keeps them itself (it ships one for a third-party GPTQ copy of
   Qwen3.8 27B).

**spinf-serve 0.1.1's format**, what the published checkpoints ship::

    {"n_out": 64, "source": "how it was measured",
     "outliers": {"layers.0.linear_attn.in_proj_qkvz": [42, 255, ...],     # a Gated DeltaNet's qkv + z input
                  "layers.3.self_attn.qkv_proj": [...],                     # an attention layer's q + k + v
                  "layers.0.mlp.gate_up_proj": [...], ...}}                 # every layer's gate + up

Keys are the reference's fused module names under the text prefix (no ``model.language_model.``); each maps onto the
first full weight name of our fused group (`FUSED_NAMES`): in_proj_qkvz is in_proj_qkv + in_proj_z, qkv_proj is
q/k/v_proj, gate_up_proj is gate/up_proj, and a group's parts share their input, so one list serves the whole
group. ``n_out``, when present, is every list's length. Any other key, and an entry for a linear the model does not
have (another layer count, a linear that is not norm-fed), is ignored and logged once: the reference reads only the
entries it needs.

**Our format** (`spinf.engine.qwen35.int4_write` writes it)::

    {"format_version": 1,
     "channels": 64,                      # indices per linear
     "linears": {"model.language_model.layers.0.linear_attn.in_proj_qkv": [3, 17, ...], ...},
     "calibration": {"tokens": 8192, "dtype": "bfloat16"}}      # optional: how it was measured

keyed by the first full weight name (without ``.weight``) of each norm-fed group, one entry per group and no other
key. Either way each norm-fed linear needs its list: unique input channels inside the hidden size (any count: the
split scheme's kernels take C channels, the published tables 64), sorted as read. A missing list, a repeated or
out-of-range channel, a count off ``n_out``/``channels`` is a `ModelError` naming the file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from spinf.engine.qwen35.config import FULL, log_ignored, read_qwen35_config
from spinf.engine.scales import stored_tables
from spinf.errors import ModelError

log = logging.getLogger(__name__)

OUTLIERS_FILE = "spinf_outliers.json"
OUTLIERS_VERSION = 1
REVISION_SUFFIX = "-outliers.json"  # the per-revision table's name: <revision>-outliers.json
# the norm-fed fused groups by their first name after the layer prefix (our key), and the reference's fused name
FUSED_NAMES = {
    "linear_attn.in_proj_qkv": "linear_attn.in_proj_qkvz",
    "self_attn.q_proj": "self_attn.qkv_proj",
    "mlp.gate_proj": "mlp.gate_up_proj",
}
NORM_FED = tuple(FUSED_NAMES)
_OUR_KEYS = {"format_version", "channels", "linears", "calibration"}
_REFERENCE_KEYS = {"n_out", "source", "outliers"}


def norm_fed_names(layer_types: Sequence[str], prefix: str) -> list[str]:
    """The first full names of the norm-fed fused groups, layer by layer (our format's keys)."""
    return [name for name, _ in _norm_fed(layer_types, prefix)]


def _norm_fed(layer_types: Sequence[str], prefix: str) -> list[tuple[str, str]]:
    """(our key, the reference's key) of each norm-fed group, layer by layer: the mixer's input, then gate/up."""
    pairs = []
    for i, kind in enumerate(layer_types):
        mixer = "self_attn.q_proj" if kind == FULL else "linear_attn.in_proj_qkv"
        for first in (mixer, "mlp.gate_proj"):
            pairs.append((f"{prefix}layers.{i}.{first}", f"layers.{i}.{FUSED_NAMES[first]}"))
    return pairs


def revision_tables(model_id: str, revision: str) -> list[Path]:
    """The places outside the checkpoint where its revision's table may be, in lookup order: beside each place of
    its fp8s scale table (`spinf.engine.scales.stored_tables`, the module docstring's list), ``<revision>.json``
    there becoming ``<revision>-outliers.json``."""
    return [path.with_name(path.stem + REVISION_SUFFIX) for path in stored_tables(model_id, revision)]


def table_paths(folder: str | Path, model_id: str = "", revision: str = "") -> list[Path]:
    """Where the table is looked for, in order: the checkpoint folder, then (when ``model_id`` is known) the places
    of `revision_tables`."""
    return [Path(folder) / OUTLIERS_FILE, *(revision_tables(model_id, revision) if model_id else [])]


def missing_table_error(folder: str | Path, model_id: str = "", revision: str = "") -> ModelError:
    """The refusal of ``i8`` without a table: the places looked at, and the way out."""
    where = ", ".join(str(path) for path in table_paths(folder, model_id, revision))
    return ModelError(
        f"the int4 i8 mode needs the checkpoint's outlier table, and there is none (looked at {where}; engine spec "
        "B.14.3): add the table, or run another mode (f16, fp8, bf16)"
    )


def read_outliers(folder: str | Path, model_id: str = "", revision: str = "") -> dict[str, tuple[int, ...]] | None:
    """The outlier table of the checkpoint in ``folder`` (see the module docstring), found where `table_paths` says,
    in either format: each norm-fed group's first full name -> its channels, sorted. None when there is no table;
    `ModelError` naming the file for one that cannot be read or does not fit the model."""
    path = next((p for p in table_paths(folder, model_id, revision) if p.is_file()), None)
    if path is None:
        return None
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelError(f"cannot read {path}: {error}") from error
    if not isinstance(table, dict):
        raise ModelError(f"{path} is not a JSON object")
    cfg, prefix = read_qwen35_config(folder)
    groups = _norm_fed(cfg.layer_types, prefix)
    if "format_version" in table:
        linears = _ours(path, table, [ours for ours, _ in groups])
        count = ("channels", table["channels"])
        lists = [(ours, f"linears[{ours!r}]", linears[ours]) for ours, _ in groups]
    elif "outliers" in table:
        entries, n_out = _reference(path, table, [theirs for _, theirs in groups])
        count = ("n_out", n_out)
        lists = [(ours, f"outliers[{theirs!r}]", entries[theirs]) for ours, theirs in groups]
    else:
        raise ModelError(
            f"{path}: neither outlier-table format: no 'format_version' (ours) nor 'outliers' (spinf-serve 0.1.1's)"
        )
    return {ours: _channels(path, where, channels, count, cfg.hidden_size) for ours, where, channels in lists}


def _ours(path: Path, table: dict, wanted: list[str]) -> dict:
    """Our format's ``linears``, after its schema checks: no other key, exactly one entry per norm-fed group."""
    unknown = sorted(set(table) - _OUR_KEYS)
    if unknown:
        raise ModelError(f"{path}: unknown key {unknown[0]!r}")
    if table.get("format_version") != OUTLIERS_VERSION:
        raise ModelError(f"{path}: format_version {table.get('format_version')!r}, expected {OUTLIERS_VERSION}")
    count, linears = table.get("channels"), table.get("linears")
    if type(count) is not int or count <= 0:
        raise ModelError(f"{path}: channels {count!r} is not a positive integer")
    if not isinstance(linears, dict):
        raise ModelError(f"{path}: linears is not a JSON object")
    missing, extra = sorted(set(wanted) - set(linears)), sorted(set(linears) - set(wanted))
    if missing or extra:
        which = f"no entry for {missing[0]}" if missing else f"an entry for {extra[0]}, which is no norm-fed linear"
        raise ModelError(f"{path}: {which} (one entry per norm-fed linear: {len(wanted)})")
    return linears


def _reference(path: Path, table: dict, wanted: list[str]) -> tuple[dict, int | None]:
    """spinf-serve 0.1.1's ``outliers`` and ``n_out`` (None when absent); what the model does not need is logged
    once and ignored, a missing entry is an error."""
    count, entries = table.get("n_out"), table["outliers"]
    if count is not None and (type(count) is not int or count <= 0):
        raise ModelError(f"{path}: n_out {count!r} is not a positive integer")
    if not isinstance(entries, dict):
        raise ModelError(f"{path}: outliers is not a JSON object")
    missing = [name for name in wanted if name not in entries]
    if missing:
        raise ModelError(
            f"{path}: no entry for {missing[0]} in outliers (spinf-serve 0.1.1's fused names, one per norm-fed "
            f"linear of the model: {len(wanted)}; {len(missing)} missing)"
        )
    log_ignored(log, path, "keys this build does not read", sorted(set(table) - _REFERENCE_KEYS))
    log_ignored(log, path, "entries for linears this model does not have", sorted(set(entries) - set(wanted)))
    return entries, count


def _channels(path: Path, where: str, channels: object, count: tuple[str, int | None], width: int) -> tuple[int, ...]:
    """One list's checks: integers, none repeated, as many as ``count`` says (its key and value; any number but 0
    when the value is None), inside ``width``."""
    if not isinstance(channels, list) or not all(type(c) is int for c in channels) or not channels:
        raise ModelError(f"{path}: {where} is not a non-empty list of integers")
    repeated = next((c for i, c in enumerate(channels) if c in channels[:i]), None)
    if repeated is not None:
        raise ModelError(f"{path}: {where} repeats channel {repeated}")
    key, expected = count
    if expected is not None and len(channels) != expected:
        raise ModelError(f"{path}: {where} has {len(channels)} channels, not {key} {expected}")
    if not all(0 <= c < width for c in channels):
        raise ModelError(f"{path}: {where} has a channel outside the input width {width}")
    return tuple(sorted(channels))
