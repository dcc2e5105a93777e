"""The Qwen3.5 text-model configuration the engine needs, read from a checkpoint's ``config.json``.

Two layouts: the published one (``model_type`` ``qwen3_5``, transformers' ``Qwen3_5ForConditionalGeneration``) with
the text config nested under ``text_config`` and the text weights under ``model.language_model.`` (the vision tower
beside them, ``model.visual.``, and the multi-token-prediction head, ``mtp.``, are not read here); and a bare text
config (``qwen3_5_text``) with its weights under ``model.``. The fields are those of transformers'
``Qwen3_5TextConfig``, with its defaults where a key is absent. Features this decoder does not run (attention
biases, another activation) are refused by name. `log_ignored` says, once, what the stack's side files (the
decider's config and readout, the outlier table) carry that it does not read.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import attrs

from spinf.catalog.resolve import read_config
from spinf.engine.folder import check_sizes, config_in_file
from spinf.errors import ModelError

QWEN35_TYPES = {"qwen3_5": "model.language_model.", "qwen3_5_text": "model."}  # model type -> text weight prefix
LINEAR, FULL = "linear_attention", "full_attention"
_LOGGED: set[str] = set()  # `log_ignored`'s lines so far: each file's ignored keys are said once per process


def log_ignored(logger: logging.Logger, path: str | Path, what: str, names: Sequence[str]) -> None:
    """Log once per process that ``path`` (a side file another tool wrote: a decider's config, an outlier table)
    has ``names`` (``what`` they are, and why they are not read); nothing when there are none. Such files are read
    as their writers read them: what is not needed is ignored, never refused."""
    if not names:
        return
    line = f"{path}: ignoring {what}: {', '.join(names)}"
    if line not in _LOGGED:
        _LOGGED.add(line)
        logger.info("%s", line)


SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


@attrs.frozen
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]  # per layer, `LINEAR` (a Gated DeltaNet) or `FULL` (gated softmax attention)
    # full attention: q (with its output gate), k, v heads; rope on the first ``rotary_dim`` dims of each head
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    mrope_section: tuple[int, ...]  # 3-D rotary sections (t, h, w) over the rotary pairs; text uses t = h = w
    # Gated DeltaNet: q/k heads, v heads (each q/k head serves consecutive v heads), head dims, conv taps
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """The channels of the GDN's causal convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim


def read_qwen35_config(folder: str | Path) -> tuple[Qwen35Config, str]:
    """The text config of the Qwen3.5 checkpoint in ``folder`` and the weight-name prefix of its text model."""
    return config_in_file(Path(folder) / "config.json", _text_config, read_config(Path(folder)))


def _text_config(raw: dict) -> tuple[Qwen35Config, str]:
    model_type = raw.get("model_type")
    if model_type not in QWEN35_TYPES:
        raise ModelError(f"model_type {model_type!r} is not a Qwen3.5 model ({', '.join(QWEN35_TYPES)})")
    text = raw
    if model_type == "qwen3_5":
        text = dict(raw.get("text_config") or {})
        text.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", False))
        text.setdefault("eos_token_id", raw.get("eos_token_id"))
    config = parse_qwen35_config(text)
    check_sizes(config, SIZES)
    return config, QWEN35_TYPES[model_type]


def parse_qwen35_config(raw: dict) -> Qwen35Config:
    """A `Qwen35Config` from a ``Qwen3_5TextConfig`` dict (transformers' defaults for absent keys)."""
    if raw.get("attention_bias", False):
        raise ModelError("Qwen3.5 attention with biases (attention_bias) is not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelError(f"Qwen3.5 hidden_act {raw['hidden_act']!r} is not supported (silu only)")
    num_layers = raw.get("num_hidden_layers", 32)
    interval = raw.get("full_attention_interval", 4)
    layer_types = tuple(
        raw.get("layer_types") or [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
    )
    unknown = sorted(set(layer_types) - {LINEAR, FULL})
    if unknown or len(layer_types) != num_layers:
        raise ModelError(f"Qwen3.5 layer_types: {num_layers} layers of {LINEAR}/{FULL} expected, got {layer_types}")
    head_dim = raw.get("head_dim", 256)
    rope = _rope(raw, head_dim)
    eos = raw.get("eos_token_id")
    return Qwen35Config(
        vocab_size=raw.get("vocab_size", 248320),
        hidden_size=raw.get("hidden_size", 4096),
        intermediate_size=raw.get("intermediate_size", 12288),
        layer_types=layer_types,
        num_heads=raw.get("num_attention_heads", 16),
        num_kv_heads=raw.get("num_key_value_heads", 4),
        head_dim=head_dim,
        **rope,
        linear_num_key_heads=raw.get("linear_num_key_heads", 16),
        linear_num_value_heads=raw.get("linear_num_value_heads", 32),
        linear_key_head_dim=raw.get("linear_key_head_dim", 128),
        linear_value_head_dim=raw.get("linear_value_head_dim", 128),
        linear_conv_kernel_dim=raw.get("linear_conv_kernel_dim", 4),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
    )


def _rope(raw: dict, head_dim: int) -> dict:
    """The rotary fields of a `Qwen35Config`, read as transformers reads them: ``rope_parameters`` (or the legacy
    ``rope_scaling``), its ``rope_theta`` and ``partial_rotary_factor`` falling back to top-level keys, then to
    10,000 and 0.25 (``Qwen3_5TextConfig``'s defaults); the rotary dims ``int(head_dim · factor)``, as
    ``compute_default_rope_parameters`` takes them. ``mrope_section`` defaults to [11, 11, 10], which
    ``Qwen3_5TextRotaryEmbedding`` applies whether or not the config names it: its interleaved layout clips the
    sections to the rotary pairs there are, so any three counts work (a text position has t = h = w, so text runs
    plain rotary whatever they are; they matter only for image rows). transformers always interleaves the sections
    (`spinf.engine.qwen35.model.rope_axes`) and does not read ``mrope_interleaved``; nor does this."""
    rope = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ModelError(f"Qwen3.5 rope_type {kind!r} is not supported (default only)")
    fraction = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25))
    rotary_dim = int(head_dim * fraction)
    section = rope.get("mrope_section", (11, 11, 10))
    if (
        not isinstance(section, list | tuple)
        or len(section) != 3
        or not all(isinstance(n, int) and n >= 0 for n in section)
    ):
        raise ModelError(f"Qwen3.5 mrope_section {section!r} is not three counts of rotary pairs (t, h, w)")
    if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise ModelError(f"Qwen3.5 partial_rotary_factor {fraction} gives {rotary_dim} rotary dims of {head_dim}")
    return {
        "rotary_dim": rotary_dim,
        "rope_theta": float(rope.get("rope_theta", raw.get("rope_theta", 10_000.0))),
        "mrope_section": tuple(section),
    }
