"""Opening a model (api spec §9.6–9.8), the one place an engine's model is opened: given the model resolved once
(`spinf.catalog.resolve_model`; ``spinf-serve`` resolves it for its settings and hands it down), refuse what cannot
run, find the checkpoint, choose the scheme, in that order, before a weight is read; then load its stack and its
media embedders (`open_model`).

`check_before_lookup` makes every refusal that the manifest, the settings and the device decide (the family, the
device, the scheme, the memory for the manifest's size) before any lookup or download: ``spinf-serve serve`` calls
it before the server starts, and `open_checkpoint` before it looks for the files. What needs the files (their
format, their exact size, a scale table shipped with them) comes after the lookup. `RUNNABLE_SCHEMES` is what the
Gemma stack runs, with the dtype a checkpoint loads in (the Qwen stack's loader chooses its own).

`engine_settings` layers a library caller's keyword arguments over the model's manifest and the settings table's
defaults, as the settings layering does for the server (api spec §9.2); `model_features` narrows the server's
switches to what the model does.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import torch

from spinf.catalog import Checkpoint, ResolvedModel
from spinf.catalog.manifest import FAMILIES, INT4_MODES
from spinf.engine.gemma4 import fp8_static
from spinf.engine.gemma4.embedders import MediaConfig, load_embedders, read_media_config
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.engine.gemma4.tiny import find_or_generate
from spinf.engine.hardware import (
    INT4_PREFIX,
    DeviceFacts,
    check_hardware,
    check_requested,
    choose_quant,
    device_facts,
    settled_quant,
)
from spinf.engine.qwen35.loading import FLOAT_SCHEMES, load_for_engine
from spinf.engine.qwen35.media import QwenMedia, load_qwen_embedders, read_qwen_media
from spinf.engine.qwen35.readout import has_readout
from spinf.engine.scales import ScaleTableMismatch, find_table, missing_table_error, read_scale_table, stored_table
from spinf.engine.schemes import SCHEMES
from spinf.engine.stack import Embedders, MediaTokens, TextStack
from spinf.errors import ModelError
from spinf.settings import EngineSettings, Features

# The schemes this build runs, with the dtype the checkpoint loads in: fp8s loads bf16 and quantizes every decoder
# linear with the revision's scale table (spinf.engine.scales); fp8, fp8row, w8a16 and w8a8 load bf16 and quantize
# each layer as it arrives (spinf.engine.schemes). On the CPU they run emulated (the tiny model and local folders).
# The int4 modes (``int4-i8`` ...) run the Qwen stack's GPTQ checkpoints, whose loader chooses its own dtypes
# (`spinf.engine.qwen35.loading`).
RUNNABLE_SCHEMES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp8s": torch.bfloat16,
    **dict.fromkeys(SCHEMES, torch.bfloat16),
}
QWEN_FLOAT_SCHEMES = tuple(FLOAT_SCHEMES)  # a Qwen3.5 float checkpoint's (`spinf.engine.qwen35.loading`)
_ENGINE_FIELDS = frozenset(field.name for field in attrs.fields(EngineSettings))
_DECIDER_NOTE = "a decision model scores options only: it has no extraction or generation slots"


@attrs.frozen
class OpenedModel:
    """A model opened for an engine: the model resolved (at the ``revision`` setting), its checkpoint, the scheme,
    the stack's model with the embedders of the media kinds switched on (None: none, or none asked), what the model
    does (``features``: the switches narrowed, `model_features`), whether it is a decision model (a readout head),
    the media kinds and tokens its checkpoint reads (``media_tokens`` None: none), under fp8s the scale table's id
    (part 8 of the fingerprint, api spec §11), and a decision model's answer codes, its readout head's (None: any
    option)."""

    resolved: ResolvedModel
    checkpoint: Checkpoint
    quant: str
    model: TextStack
    embedders: Embedders | None
    features: Features
    decider: bool
    media: frozenset[str]
    media_tokens: MediaTokens | None
    scale_table: str | None
    answer_codes: frozenset[int] | None = None


def engine_settings(resolved: ResolvedModel, device: str, given: dict) -> EngineSettings:
    """The engine settings of a library caller (`Engine` without ``from_settings``): ``given`` (by setting name;
    None counts as not given) over the engine settings ``resolved``'s manifest sets, over the table's defaults."""
    manifest = {name: value for name, value in resolved.engine_defaults().items() if name in _ENGINE_FIELDS}
    chosen = {**manifest, **{name: value for name, value in given.items() if value is not None}}
    chosen["cache_dirs"] = tuple(chosen.get("cache_dirs", ()))
    return attrs.evolve(EngineSettings(model=resolved.served_name, device=device), **chosen)


def open_model(resolved: ResolvedModel, settings: EngineSettings, switches: Features) -> OpenedModel:
    """The model ``resolved`` opened under the engine ``settings``: the checks and the lookup (`open_checkpoint`),
    then its stack loaded with the embedders of the media kinds ``switches`` leave on."""
    resolved, checkpoint, quant = open_checkpoint(
        resolved,
        device=settings.device,
        quant=settings.quant,
        model_dir=settings.model_dir,
        cache_dirs=list(settings.cache_dirs) or None,
        revision=settings.revision,
        model_id=settings.model_id,
    )
    if checkpoint.family == "qwen35":
        return _open_qwen(resolved, checkpoint, quant, settings, switches)
    return _open_gemma(resolved, checkpoint, quant, settings, switches)


def _open_gemma(
    resolved: ResolvedModel, checkpoint: Checkpoint, quant: str, settings: EngineSettings, switches: Features
) -> OpenedModel:
    folder = checkpoint.folder
    media_config = read_media_config(folder)  # the unified layouts' embedders, or the 31B's tower
    media = _media(resolved, media_config)
    features = model_features(switches, resolved, media, decider=False)
    scales = path = scale_table = None
    if quant == "fp8s" and checkpoint.weight_format == fp8_static.FORMAT:
        scale_table = fp8_static.CHECKPOINT_TABLE  # its own fp8 weights and input scales, as they are
    elif quant == "fp8s":  # quantized layer by layer while loading: the bf16 weights never all sit on the GPU
        name, model_id = settings.served_model or resolved.served_name, settings.model_id or resolved.model_id
        path, table, scale_table = read_scale_table(name, model_id, checkpoint.revision, folder)
        scales = table["scales"]
    try:
        model = load_gemma4_text(
            folder,
            device=settings.device,
            dtype=RUNNABLE_SCHEMES[quant],
            scales=scales,
            layers=settings.layers,
            scheme=quant,
            lm_head=settings.lm_head,
        )
    except ScaleTableMismatch as exc:  # name the table; a damaged shard names its own file
        raise ModelError(f"{path}: {exc}") from exc
    embedders = None
    if media_config is not None and features.media:  # --media none loads none: less memory
        dtype = model.embed.weight.dtype
        hidden = model.cfg.hidden_size
        embedders = load_embedders(folder, media_config, features.media, hidden, device=settings.device, dtype=dtype)
        model.image_attention(media_config.bidirectional)
    tokens = media_config.tokens if media_config else None
    return OpenedModel(resolved, checkpoint, quant, model, embedders, features, False, media, tokens, scale_table)


def _open_qwen(
    resolved: ResolvedModel, checkpoint: Checkpoint, quant: str, settings: EngineSettings, switches: Features
) -> OpenedModel:
    folder = checkpoint.folder
    reads = read_qwen_media(folder)  # its vision tower
    media = _media(resolved, reads)
    decider = (resolved.manifest is not None and resolved.manifest.head == "readout") or has_readout(folder)
    features = model_features(switches, resolved, media, decider=decider)
    model = load_for_engine(
        folder,
        scheme=quant,
        device=settings.device,
        weight_format=checkpoint.weight_format,
        readout_expected=decider,
        model_id=settings.model_id or resolved.model_id,
        revision=checkpoint.revision,
        layers=settings.layers,
        lm_head=settings.lm_head,
    )
    embedders = None
    if reads is not None and features.media:  # --media none loads none: less memory
        embedders = load_qwen_embedders(folder, device=settings.device, dtype=model.embed.dtype)
    tokens = reads.tokens if reads else None
    # a decider has a readout head: `load_for_engine` refuses one without
    codes = frozenset(model.readout.token_ids) if decider else None
    return OpenedModel(resolved, checkpoint, quant, model, embedders, features, decider, media, tokens, None, codes)


def _media(resolved: ResolvedModel, reads: MediaConfig | QwenMedia | None) -> frozenset[str]:
    """The media kinds the model reads: its manifest's (every kind without one), those its checkpoint has
    embedders for."""
    return frozenset(resolved.media) & (reads.kinds if reads else frozenset())


def model_features(switches: Features, resolved: ResolvedModel, media: frozenset[str], *, decider: bool) -> Features:
    """The server's switches narrowed to what the model does (api spec §7, §9.5): the media kinds it reads, extraction
    where its capabilities have it and it is no decision model, generation only with extraction (§4.11). Media
    kinds the model reads are checked apart (media_not_supported, then media_disabled); ``extraction_note`` says
    why extraction is refused when the model rather than the server's switch refuses it."""
    capabilities = resolved.capabilities
    extraction = switches.extraction and "extract" in capabilities and not decider
    return Features(
        media=switches.media & media,
        extraction=extraction,
        generation=extraction and switches.generation and "generate" in capabilities,
        extraction_note=_DECIDER_NOTE if decider else "",
    )


def eos_ids(folder: Path, cfg) -> tuple[int, ...]:
    """The end-of-sequence ids of a checkpoint: its config's, with its generation config's (Gemma lists its end of
    turn there)."""
    ids = list(cfg.eos_token_ids)
    try:
        extra = json.loads((Path(folder) / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError):
        extra = None
    for i in extra if isinstance(extra, list) else [] if extra is None else [extra]:
        if i not in ids:
            ids.append(i)
    return tuple(ids)


def open_checkpoint(
    resolved: ResolvedModel,
    *,
    device: str,
    quant: str = "",
    model_dir: str = "",
    cache_dirs: list[str] | None = None,
    revision: str = "",
    model_id: str = "",
) -> tuple[ResolvedModel, Checkpoint, str]:
    """The model ``resolved`` (api spec §9.6) at ``revision``, its weights found (§9.7), and the scheme chosen and
    checked (§9.8).

    ``revision`` (the ``revision`` setting) replaces the manifest's pin when given; ``model_id`` (the setting)
    replaces the checkpoint repo that keys the scale-table store. Every refusal that needs no checkpoint comes
    before the lookup (`check_before_lookup`), so a refused start downloads nothing; the others come after it, on
    the files found (their format and exact size, a scale table shipped with them), before a weight is read.
    """
    resolved, facts = check_before_lookup(
        resolved, device=device, quant=quant, model_dir=model_dir, revision=revision, model_id=model_id
    )
    checkpoint = find_or_generate(resolved, model_dir=model_dir, cache_dirs=cache_dirs)
    model_id = model_id or resolved.model_id
    table = find_table(model_id, checkpoint.revision, checkpoint.folder)
    size = checkpoint.num_bytes()
    _check_family(resolved.served_name, checkpoint.family)
    scheme = choose_quant(
        resolved,
        quant,
        facts.capability,
        weight_format=checkpoint.weight_format,
        has_scale_table=table is not None,
        checkpoint_bytes=size,
        free_bytes=facts.free_bytes,
        family=checkpoint.family,
    )
    check_hardware(resolved, scheme, device, size, weight_format=checkpoint.weight_format, facts=facts)
    _check_runnable(resolved.served_name, checkpoint.family, scheme)
    if scheme == "fp8s" and table is None and checkpoint.weight_format != fp8_static.FORMAT:
        raise missing_table_error(resolved.served_name, model_id, checkpoint.revision, checkpoint.folder)
    return resolved, checkpoint, scheme


def check_before_lookup(
    resolved: ResolvedModel,
    *,
    device: str,
    quant: str = "",
    model_dir: str = "",
    revision: str = "",
    model_id: str = "",
) -> tuple[ResolvedModel, DeviceFacts]:
    """``resolved`` at ``revision`` (which replaces the manifest's pin when given) and the device's facts, after
    every refusal that needs no checkpoint and no network: what the manifest (family, format, schemes, size), the
    settings (quant, device) and the device (there at all, its compute capability, its free memory) decide.
    `open_checkpoint` calls it before the lookup, ``spinf-serve serve`` before the server starts: a refused start
    downloads nothing.

    In order: the family; the catalog model's need of a GPU; the scheme (`settled_quant`: the automatic choice
    when the lookup cannot change it) against the manifest's schemes, the compute capability, and the free memory
    for the manifest's ``bytes`` (only at its pinned revision); the format and scheme this build loads. For a repo
    outside the catalog only what holds whatever its format is checked (`check_requested`). A folder given (the
    model or ``model_dir``) is never fetched: beyond the device, its checks wait for its files.
    """
    if revision and revision != resolved.revision:
        resolved = attrs.evolve(resolved, revision=revision)
    facts = device_facts(device)
    if model_dir or resolved.local_folder is not None:
        return resolved, facts
    name, manifest = resolved.served_name, resolved.manifest
    if resolved.family is not None:
        _check_family(name, resolved.family)
    size = manifest.source.bytes if manifest is not None and resolved.revision == manifest.source.revision else None
    model_id = model_id or resolved.model_id
    stored = resolved.revision is not None and stored_table(model_id, resolved.revision) is not None
    scheme = settled_quant(
        resolved, quant, facts.capability, has_scale_table=stored, checkpoint_bytes=size, free_bytes=facts.free_bytes
    )
    if scheme is None:
        check_requested(resolved, quant, device, facts)
    else:
        check_hardware(resolved, scheme, device, size, facts=facts)
    if resolved.weight_format is not None:
        _check_runnable(name, resolved.family, scheme)
    return resolved, facts


def _check_family(name: str, family: str) -> None:
    if family not in FAMILIES:
        raise ModelError(f"{name}: the {family} stack is not available in this build")


def _check_runnable(name: str, family: str | None, scheme: str | None) -> None:
    """Refuses a scheme the model's stack does not run, saying what would run instead; ``scheme`` None: not settled
    yet, ``family`` None: not known yet (a Hub repo before its config is read). The int4 modes run the Qwen3.5
    stack's GPTQ checkpoints; that stack's float checkpoints run fp32 or bf16, the Gemma stack every other scheme.

    Whether fp8s has its scale table is asked after the lookup, since a checkpoint may ship its own.
    """
    if scheme is None or family is None:
        return
    int4 = scheme.startswith(INT4_PREFIX)
    if family == "qwen35" and not int4 and scheme not in QWEN_FLOAT_SCHEMES:
        raise ModelError(
            f"{name}: the {scheme} scheme runs the Gemma 4 stack only; a Qwen3.5 checkpoint runs "
            f"{' or '.join(QWEN_FLOAT_SCHEMES)} (float weights) or the int4 modes {', '.join(INT4_MODES)} (GPTQ)"
        )
    if family != "qwen35" and int4:
        raise ModelError(
            f"{name}: the {scheme} scheme runs GPTQ checkpoints of the Qwen3.5 stack only; a Gemma 4 checkpoint runs "
            f"{', '.join(RUNNABLE_SCHEMES)}"
        )
