"""The decider's readout head (engine spec A.15): its two files, their checks, and the log-probs it gives a read row.

A decision model has no LM head. Its checkpoint carries a readout matrix ``R`` [codes, hidden] and a decision config;
a read row's final-normed hidden state ``x`` gives ``logits = x · Rᵀ`` in fp32, divided by the temperature and
scattered to the codes' vocabulary ids in a full-vocabulary row of −inf, then log-softmaxed. Every other token's
log-prob is −inf, so all mass lies on the codes, and the scorer reads options from these rows exactly as from an LM
head's (A.7, A.8): renormalised over a question's options they are the decider's own masked softmax.

The files, in the checkpoint's folder, read as spinf-serve 0.1.1 and the checkpoint's public loaders read them:

* ``readout.safetensors``: the tensor ``weight`` (`READOUT_TENSOR`), float, shape [codes, hidden], finite; row ``i``
  belongs to ``token_ids[i]``. Other tensors in the file are ignored (logged once).
* ``decision_config.json``: an object with the keys ``format_version`` (the integer 1), ``token_ids`` (the
  single-token answer codes' vocabulary ids: distinct, inside the vocabulary, one per row of ``R``) and
  ``temperature`` (a finite number above 0). Other keys (the published file's ``codes``, the code strings its
  loaders read) are ignored (logged once).

Whatever is wrong with either file is a `ModelError` that names the file and the problem.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from spinf.engine.gemm import stable_mm
from spinf.engine.qwen35.config import log_ignored
from spinf.errors import ModelError

log = logging.getLogger(__name__)

READOUT_FILE = "readout.safetensors"
DECISION_CONFIG_FILE = "decision_config.json"
READOUT_TENSOR = "weight"
FORMAT_VERSION = 1
_CONFIG_KEYS = ("format_version", "token_ids", "temperature")
# write_readout's scale: logits x·R of a final-normed row (entries near 1) have a standard deviation of about 3
# before the temperature, so the codes' distributions are far from flat.
_LOGIT_SCALE = 3.0


@attrs.frozen(eq=False)
class Readout:
    """A decider's readout head: ``matrix`` [codes, hidden] fp32, row ``i`` scoring ``token_ids[i]`` (also as the
    LongTensor ``token_index``, on the matrix's device), over a vocabulary of ``vocab_size`` ids."""

    matrix: torch.Tensor  # [codes, hidden] fp32
    token_ids: tuple[int, ...]
    token_index: torch.Tensor  # [codes] int64
    temperature: float
    vocab_size: int

    @property
    def num_codes(self) -> int:
        return len(self.token_ids)

    @property
    def hidden_size(self) -> int:
        return self.matrix.shape[1]

    def logprobs(self, x: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary fp32 log-probs [rows, vocab] of the final-normed hidden rows ``x`` [rows, hidden]: −inf off
        the codes. The product runs in fixed row blocks (`stable_mm`), so a row's bits never depend on the others."""
        logits = stable_mm(x.float(), self.matrix) / self.temperature  # [rows, codes]
        full = logits.new_full((x.shape[0], self.vocab_size), -math.inf)
        full.index_copy_(1, self.token_index, logits)
        return torch.log_softmax(full, dim=-1)

    def to(self, device: torch.device | str) -> Readout:
        return attrs.evolve(self, matrix=self.matrix.to(device), token_index=self.token_index.to(device))


def has_readout(folder: str | Path) -> bool:
    """Whether ``folder`` carries a readout head (either of its files: `read_readout` then says what is missing)."""
    folder = Path(folder)
    return (folder / READOUT_FILE).is_file() or (folder / DECISION_CONFIG_FILE).is_file()


def read_readout(folder: str | Path, *, hidden_size: int, vocab_size: int) -> Readout:
    """The readout head in ``folder`` for a model of width ``hidden_size`` over ``vocab_size`` token ids."""
    folder = Path(folder)
    token_ids, temperature = _read_decision_config(folder / DECISION_CONFIG_FILE, vocab_size)
    matrix = _read_matrix(folder / READOUT_FILE)
    path = folder / READOUT_FILE
    if matrix.shape[0] != len(token_ids):
        raise ModelError(
            f"{path}: {READOUT_TENSOR} has {matrix.shape[0]} rows but {DECISION_CONFIG_FILE} lists "
            f"{len(token_ids)} token_ids (one row per code)"
        )
    if matrix.shape[1] != hidden_size:
        raise ModelError(f"{path}: {READOUT_TENSOR} is {matrix.shape[1]} wide; the model is {hidden_size}")
    bad = ~torch.isfinite(matrix)
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ModelError(
            f"{path}: {READOUT_TENSOR} has {int(bad.sum())} non-finite entries (the first at row {row}, column {col})"
        )
    return Readout(
        matrix=matrix,
        token_ids=token_ids,
        token_index=torch.tensor(token_ids, dtype=torch.long),
        temperature=temperature,
        vocab_size=vocab_size,
    )


def _read_decision_config(path: Path, vocab_size: int) -> tuple[tuple[int, ...], float]:
    if not path.is_file():
        raise ModelError(f"{path}: missing (a readout head needs {DECISION_CONFIG_FILE} and {READOUT_FILE})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))  # NaN parses (as for the reference): the checks refuse it
    except (ValueError, OSError) as exc:
        raise ModelError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: not a JSON object")
    log_ignored(log, path, "keys this build does not read", sorted(set(raw) - set(_CONFIG_KEYS)))
    missing = [key for key in _CONFIG_KEYS if key not in raw]
    if missing:
        raise ModelError(f"{path}: missing key {missing[0]!r}")
    version = raw["format_version"]
    if not _is_int(version) or version != FORMAT_VERSION:
        raise ModelError(f"{path}: format_version is {version!r}; only {FORMAT_VERSION} is supported")
    return _check_token_ids(path, raw["token_ids"], vocab_size), _check_temperature(path, raw["temperature"])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_token_ids(path: Path, token_ids: Any, vocab_size: int) -> tuple[int, ...]:
    if not isinstance(token_ids, list) or not token_ids:
        raise ModelError(f"{path}: token_ids must be a non-empty list of token ids")
    for i, token_id in enumerate(token_ids):
        if not _is_int(token_id):
            raise ModelError(f"{path}: token_ids[{i}] is {token_id!r}, not an integer")
        if not 0 <= token_id < vocab_size:
            raise ModelError(f"{path}: token_ids[{i}] is {token_id}, outside the vocabulary [0, {vocab_size})")
    seen: dict[int, int] = {}
    for i, token_id in enumerate(token_ids):
        if token_id in seen:
            raise ModelError(f"{path}: token_ids[{i}] repeats {token_id} (first at token_ids[{seen[token_id]}])")
        seen[token_id] = i
    return tuple(token_ids)


def _check_temperature(path: Path, temperature: Any) -> float:
    if not isinstance(temperature, int | float) or isinstance(temperature, bool):
        raise ModelError(f"{path}: temperature is {temperature!r}, not a number")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ModelError(f"{path}: temperature is {temperature!r}; it must be finite and above 0")
    return float(temperature)


def _read_matrix(path: Path) -> torch.Tensor:
    if not path.is_file():
        raise ModelError(f"{path}: missing (a readout head needs {DECISION_CONFIG_FILE} and {READOUT_FILE})")
    try:
        with safe_open(str(path), framework="pt") as f:
            names = sorted(f.keys())
            if READOUT_TENSOR not in names:
                raise ModelError(f"{path}: holds the tensors {names}; a readout's matrix is {READOUT_TENSOR!r}")
            matrix = f.get_tensor(READOUT_TENSOR)
    except (SafetensorError, OSError) as exc:
        raise ModelError(f"{path}: not a readable safetensors file ({exc})") from exc
    log_ignored(log, path, "tensors this build does not read", [name for name in names if name != READOUT_TENSOR])
    if matrix.dim() != 2 or not matrix.is_floating_point():
        raise ModelError(
            f"{path}: {READOUT_TENSOR} is a {matrix.dim()}-D {matrix.dtype} tensor; a readout is a 2-D float matrix "
            f"[codes, hidden]"
        )
    return matrix.float().contiguous()


def write_readout(
    folder: str | Path, *, hidden_size: int, token_ids: Sequence[int], temperature: float, seed: int = 0
) -> Path:
    """Write a readout head into ``folder`` (created if needed) with a random matrix drawn from ``seed``: its two
    files, the same bytes for the same arguments. Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    matrix = torch.randn((len(token_ids), hidden_size), generator=generator, dtype=torch.float32)
    matrix = matrix * (_LOGIT_SCALE / math.sqrt(hidden_size))
    save_file({READOUT_TENSOR: matrix}, str(folder / READOUT_FILE), metadata={"format": "pt"})
    config = {"format_version": FORMAT_VERSION, "token_ids": [int(i) for i in token_ids], "temperature": temperature}
    (folder / DECISION_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return folder


__all__ = [
    "DECISION_CONFIG_FILE",
    "FORMAT_VERSION",
    "READOUT_FILE",
    "READOUT_TENSOR",
    "Readout",
    "has_readout",
    "read_readout",
    "write_readout",
]
