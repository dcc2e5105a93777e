"""Side files of a Qwen3.5 checkpoint written as spinf-serve 0.1.1 and the published checkpoints have them, for the
tests that read them (tests/engine/qwen35/test_reference_files.py, tests/test_reference_qwen_files.py).

Independent of the engine's readers: the outlier table's keys are made here from the checkpoint's tensor names by
the reference's own load-time fusion (a module path's last name mapped to its fused module, the text prefix
dropped), not by `spinf.engine.qwen35.outliers`' mapping, which the tests check.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# spinf-serve 0.1.1 fuses these checkpoint linears at load (in its Qwen3.5 loader) and keys its outlier table by the
# fused module's path under the text prefix
REFERENCE_FUSION = {
    "in_proj_qkv": "in_proj_qkvz",
    "in_proj_z": "in_proj_qkvz",
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}
REFERENCE_PREFIX = "model.language_model."  # the only text prefix the reference reads
OUTLIERS = "spinf_outliers.json"
SOURCE = "act_outliers on one calibration stream of the tiny model, fp32"


def reference_outliers(table: dict) -> dict:
    """Our-format ``table`` (as `write_gptq_checkpoint` writes it) as the reference's exporter writes its tables:
    ``n_out``, ``source`` and ``outliers`` keyed by fused module names, each list ascending."""
    outliers = {}
    for name, channels in table["linears"].items():
        head, _, leaf = name.removeprefix(REFERENCE_PREFIX).rpartition(".")
        outliers[f"{head}.{REFERENCE_FUSION[leaf]}"] = sorted(channels)
    return {"n_out": table["channels"], "source": SOURCE, "outliers": outliers}


def rewrite_outliers_as_reference(folder: Path, **extra) -> dict:
    """Replace the folder's outlier table (ours) by the same channels in the reference's format, with ``extra`` keys
    at the top level; return what was written."""
    path = folder / OUTLIERS
    table = reference_outliers(json.loads(path.read_text())) | extra
    path.write_text(json.dumps(table))  # the reference's exporter: json.dump, one line
    return table


def add_published_decider_keys(folder: Path) -> None:
    """Give a decider's folder the published files' extras: ``codes`` (the answer codes' strings, which public loaders
    read) and other keys in decision_config.json, and a second tensor in readout.safetensors."""
    from spinf.engine.tokenizer import TextTokenizer

    config_path = folder / "decision_config.json"
    config = json.loads(config_path.read_text())
    tokenizer = TextTokenizer.from_folder(folder)
    config["codes"] = [tokenizer.decode([token_id]) for token_id in config["token_ids"]]
    config["fit"] = {"split": "validation", "nll": 0.4125, "ece": float("nan")}  # json writes NaN, and reads it
    config_path.write_text(json.dumps(config, indent=2))
    readout = folder / "readout.safetensors"
    tensors = load_file(str(readout))
    tensors["bias"] = torch.zeros(tensors["weight"].shape[0])
    save_file(tensors, str(readout))
