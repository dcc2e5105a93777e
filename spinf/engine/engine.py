"""The library entry point: ``Engine(model, device).score(body)`` answers a ``/v1/score`` body in-process.

It ties the pieces together in straight-line order: parse the body (`spinf.protocol`), compile it against the
tokenizer (`spinf.engine.compiler`), run the jobs (`spinf.engine.scorer`), and assemble the response
(`spinf.engine.results`). Request problems raise `ApiError` with the spec's status, code and param; running out of
memory during a call's passes is one of them (413 ``request_too_large``, api spec §4.9), after which the engine
either is back at its idle memory or says it is ``degraded`` (§3.2).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import traceback
from pathlib import Path

import attrs
import torch

from spinf._version import __version__
from spinf.engine import hostgc
from spinf.engine.compiler import EngineShape
from spinf.engine.extractor import DEFAULT_DECODE_BUDGET_GIB, DEFAULT_DECODER_BUDGET_GIB, Extractor, cpu_context
from spinf.engine.gemma4 import fp8_static
from spinf.engine.gemma4.embedders import load_embedders, read_media_config
from spinf.engine.gemma4.loading import load_gemma4_text
from spinf.engine.gemma4.tiny import TINY_MODEL_ID
from spinf.engine.head import DEFAULT_HEAD
from spinf.engine.loop import EngineLoop
from spinf.engine.opening import RUNNABLE_SCHEMES, open_checkpoint
from spinf.engine.qwen35.loading import load_for_engine as load_qwen35_for_engine
from spinf.engine.qwen35.media import load_qwen_embedders, read_qwen_media
from spinf.engine.qwen35.readout import has_readout
from spinf.engine.results import usage
from spinf.engine.scales import (
    CALIBRATE_COMMAND,
    ScaleTableMismatch,
    read_scale_table,
)
from spinf.engine.scorer import Scorer, is_out_of_memory
from spinf.engine.tokenizer import TextTokenizer
from spinf.engine.work import Call, Parsed, Scored, Sent
from spinf.errors import ApiError, ModelError
from spinf.media.items import decode_media
from spinf.packs.calls import PackStep
from spinf.packs.responses import add_pack_results
from spinf.protocol.ids import new_request_id
from spinf.protocol.request import parse_score_request
from spinf.protocol.types import ScoreRequest
from spinf.settings import SETTING, Features, Limits

log = logging.getLogger(__name__)
DEFAULT_TOKEN_BUDGET = 16_384
DEFAULT_MAX_TOKENS = 65_536
DEFAULT_FLOOR_CACHE = 65_536
DEFAULT_MAX_PASS_S = 0.5  # the settings table's default: on a CPU; a GPU's passes keep to the token budget unless set
# How far over its idle figure device memory may stay after an out-of-memory error before the engine calls itself
# degraded: what a first call keeps for the life of the process when the error came before any call succeeded
# (cuBLAS's workspace, 32 MiB on Hopper; the fused path's constants). A leaked pass is far larger.
IDLE_SLACK_BYTES = 64 * 2**20


def _engine_counters(usage: dict, packed_tokens: int) -> dict:
    """The trusted or ``--debug`` additions to ``usage`` (api spec §5.7): packed tokens and flat counters."""
    details, content = usage["prompt_tokens_details"], usage["content"]
    return {
        "packed_tokens": packed_tokens,  # no alignment padding on this path
        "content_tokens": details["content_tokens"],
        "text_tokens": details["text_tokens"],
        "query_tokens": details["query_tokens"],
        "floor_tokens": details["floor_tokens"],
        "generated_tokens": usage["completion_tokens"],
        "images": content["images"],
        "image_tokens": content["image_tokens"],
        "video_frames": content["video_frames"],
        "video_tokens": content["video_tokens"],
        "audio_ms": round(content["audio_seconds"] * 1000),
        "audio_tokens": content["audio_tokens"],
    }


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


def _given(settings, name: str) -> bool:
    """Whether ``name`` was set, in any layer or by building the settings with another value than its default."""
    return settings.origin(name) != "default" or getattr(settings.engine, name) != SETTING[name].default


def round_up(n: int, multiple: int = 128) -> int:
    return -(-n // multiple) * multiple


class Engine:
    """One loaded model and everything needed to score requests on it, synchronously.

    ``degraded`` is None while healthy; after an out-of-memory error that left device memory above the idle figure
    it says how much is still held, and stays set (api spec §3.2: the server reports it and exits).
    """

    def __init__(
        self,
        model: str | None = TINY_MODEL_ID,
        *,
        device: str = "cpu",
        limits: Limits | None = None,
        token_budget: int | None = None,
        max_tokens: int | None = None,
        quant: str = "",
        model_dir: str = "",
        cache_dir: str | Path | None = None,
        cache_dirs: list[str] | None = None,
        revision: str = "",
        served_model: str = "",
        model_id: str = "",
        floor_cache: int = DEFAULT_FLOOR_CACHE,
        features: Features | None = None,
        compile: bool = True,
        layers: int = 0,
        lm_head: str = DEFAULT_HEAD,
        decode_budget_gib: float = DEFAULT_DECODE_BUDGET_GIB,
        decoder_budget_gib: float = DEFAULT_DECODER_BUDGET_GIB,
        decode_graphs: bool = True,
        max_pass_s: float | None = None,
    ):
        if cache_dir is not None:
            cache_dirs = [str(cache_dir), *(cache_dirs or [])]
        resolved, checkpoint, self.quant = open_checkpoint(
            model,
            device=device,
            quant=quant,
            model_dir=model_dir,
            cache_dirs=cache_dirs,
            revision=revision,
            model_id=model_id,
        )
        manifest = resolved.manifest
        self.resolved = resolved
        self.folder = checkpoint.folder
        # the served_model and model_id settings override what the manifest set (api spec §9.2)
        self.model_id = model_id or resolved.model_id
        self.served_name = served_model or resolved.served_name
        self.aliases = tuple(resolved.aliases)
        self.revision = checkpoint.revision
        self.weights = checkpoint.weights
        self.device = torch.device(device)
        self.limits = limits or Limits()
        # the server's switches, narrowed to what the model does (api spec §7, §9.5); media kinds the model reads
        # (its manifest's, and those its checkpoint has embedders for) are checked apart (media_not_supported, then
        # media_disabled)
        switches = features or Features()
        capabilities = resolved.capabilities
        self.family = checkpoint.family
        qwen = self.family == "qwen35"
        # what the checkpoint reads besides text: Gemma's embedders (or the 31B's tower), or the Qwen vision tower
        media_config = None if qwen else read_media_config(self.folder)
        qwen_media = read_qwen_media(self.folder) if qwen else None
        reads = media_config or qwen_media
        self.media = frozenset(resolved.media) & (reads.kinds if reads else frozenset())
        self.image_scheme = "qwen" if qwen else "gemma"  # how images become items (`spinf.media.items.SCHEMES`)
        decider = qwen and (
            (resolved.manifest is not None and resolved.manifest.head == "readout") or has_readout(self.folder)
        )
        extraction = switches.extraction and "extract" in capabilities and not decider
        note = ""  # why extraction is refused, when the model rather than the server's switch refuses it
        if decider:
            note = "a decision model scores options only: it has no extraction or generation slots"
        self.features = Features(  # generation needs extraction on (api spec §4.11, §7)
            media=switches.media & self.media,
            extraction=extraction,
            generation=extraction and switches.generation and "generate" in capabilities,
            extraction_note=note,
        )
        if decider:  # api spec §9.4: the decider forces max_extractions_per_input to 0
            self.limits = attrs.evolve(self.limits, max_extractions_per_input=0)
        budget = token_budget or (manifest.token_budget if manifest else DEFAULT_TOKEN_BUDGET)
        longest = max_tokens or (manifest.max_tokens if manifest else DEFAULT_MAX_TOKENS)
        self.shape = EngineShape(round_up(budget), round_up(longest))
        self.tokenizer = TextTokenizer.from_folder(self.folder)
        # the id of the fp8s scale table, part 8 of the fingerprint (api spec §11); None under the other schemes
        self.scale_table: str | None = None
        scales = None
        if self.quant == "fp8s" and checkpoint.weight_format == fp8_static.FORMAT:
            self.scale_table = fp8_static.CHECKPOINT_TABLE  # its own fp8 weights and input scales, as they are
        elif self.quant == "fp8s":  # quantized layer by layer while loading: the bf16 weights never all sit on the GPU
            path, table, self.scale_table = read_scale_table(
                self.served_name, self.model_id, self.revision, self.folder
            )
            scales = table["scales"]
        if qwen:
            self.model = load_qwen35_for_engine(
                self.folder,
                scheme=self.quant,
                device=device,
                weight_format=checkpoint.weight_format,
                readout_expected=decider,
                model_id=self.model_id,
                revision=self.revision,
                layers=layers,
                lm_head=lm_head,
            )
        else:
            self.model = self._load_gemma(device, scales, layers, lm_head, path if scales is not None else None)
        # only a truncated model names its layer count in the fingerprint: its scores are another model's
        self.layers = layers and len(self.model.layers)
        # the embedders of the media kinds switched on (--media none loads none: less memory)
        self.embedders = None
        if qwen_media is not None and self.features.media:
            dtype = self.model.embed.dtype
            self.embedders = load_qwen_embedders(self.folder, device=device, dtype=dtype)
        if media_config is not None and self.features.media:
            self.embedders = load_embedders(
                self.folder,
                media_config,
                self.features.media,
                self.model.cfg.hidden_size,
                device=device,
                dtype=self.model.embed.weight.dtype,
            )
            self.model.image_attention(media_config.bidirectional)
        readout = getattr(self.model, "readout", None)
        self.shape = attrs.evolve(
            self.shape,
            answer_codes=frozenset(readout.token_ids) if readout is not None else None,
            media_tokens=reads.tokens if reads else None,
            media_kinds=self.features.media & self.embedders.kinds if self.embedders else frozenset(),
        )
        # compile = false (--no-compile): every pass runs eagerly, no CUDA graph is captured (a GPU's only compile)
        self.scorer = Scorer(self.model, self.device, graphs=compile, embedders=self.embedders)
        self.degraded: str | None = None
        # Device memory while idle: taken here, then once more when the first call succeeds (in the server, the
        # first warm-up shape), since a first pass allocates what the process keeps (see IDLE_SLACK_BYTES).
        self._idle_bytes = self.scorer.allocated_bytes() or 0
        self._idle_taken = False
        self.system_fingerprint = self._fingerprint()
        log.info(
            "serving %s (%s @ %s, %s%s on %s, layers %d, CUDA graphs %s): system_fingerprint %s",
            self.served_name,
            self.model_id,
            self.revision,
            self.quant,
            f" with scale table {self.scale_table}" if self.scale_table else "",
            device,
            len(self.model.layers),
            "on" if self.scorer.graphs is not None else "off",
            self.system_fingerprint,
        )
        # Concurrent calls may share passes only under a batch-invariant scheme, and only for a catalog model (a
        # checkpoint outside the catalog carries no guarantee, api spec §9.6). fp32 on the CPU is bitwise
        # row-invariant (tests/engine/test_independence.py). fp8s on a GPU is invariant by the design of engine spec
        # B.10 (static scales, aligned jobs, shape-stable GEMMs), which rests on the GPU kernels being built
        # alongside this; only the gpu-marked tests check it. bf16 and the other GPU schemes are not invariant.
        cpu_fp32 = self.device.type == "cpu" and self.quant == "fp32"
        gpu_fp8s = self.device.type == "cuda" and self.quant == "fp8s"
        self.batch_invariant = resolved.batch_invariant and (cpu_fp32 or gpu_fp8s)
        log.info("scores are %s", self._invariance_note())
        # extraction slots decode from what their scoring pass kept (spinf.engine.extractor); none when switched off
        self.extractor = None
        if self.features.extraction:
            self.extractor = Extractor(
                self.model,
                self.tokenizer,
                eos_ids(self.folder, self.model.cfg),
                decode_budget_gib=decode_budget_gib,
                decoder_budget_gib=decoder_budget_gib,
                kernel_plan=self.scorer.decode_plan if self.device.type == "cuda" else None,
                context=cpu_context(self.device),
                # decode steps replay CUDA graphs unless --no-compile or x_cuda_graphs = false (a graph replays the
                # same kernels, so this changes speed only)
                graphs=compile and decode_graphs and self.device.type == "cuda",
            )
            self.shape = attrs.evolve(
                self.shape, capture_tokens=self.extractor.capture_tokens(), capture_cost=self.extractor.cost
            )
        # the time bound of a call's pass (spinf.engine.scheduler). Unless given, a CPU's passes keep to
        # DEFAULT_MAX_PASS_S: a full pass there takes seconds. A GPU's full pass takes a fraction of a second on the
        # 12B but over one on the Qwen 27B, whose fixed cost per pass would then be paid several times a budget
        # (measured on the H200: 163 ms for a 300-token call), so its passes keep to the token budget only
        if max_pass_s is None:
            max_pass_s = DEFAULT_MAX_PASS_S if self.device.type == "cpu" else 0.0
        self.max_pass_s = max_pass_s
        # every caller's work reaches the device through this one loop (spinf.engine.loop)
        self.loop = self.new_loop(share_passes=self.batch_invariant, floor_cache=floor_cache)

    def _load_gemma(self, device: str, scales, layers: int, lm_head: str, table: Path | None):
        try:
            return load_gemma4_text(
                self.folder,
                device=device,
                dtype=RUNNABLE_SCHEMES[self.quant],
                scales=scales,
                layers=layers,
                scheme=self.quant,
                lm_head=lm_head,
            )
        except ScaleTableMismatch as exc:  # name the table; a damaged shard names its own file
            raise ModelError(f"{table}: {exc}") from exc

    def _invariance_note(self) -> str:
        """What the start-up log says of batch invariance (``/v1/models`` and ``/v0/info`` say it as a boolean)."""
        if self.batch_invariant:
            return "batch-invariant: concurrent calls may share passes"
        why = f"{self.quant} on {self.device.type}" if self.resolved.batch_invariant else "outside the catalog"
        note = f"deterministic but not batch-invariant ({why}): each call runs in passes of its own"
        if self.quant == "fp8" and self.resolved.manifest is not None:
            note += f"; a scale table (`SPINF_MODEL={self.served_name} {CALIBRATE_COMMAND}`) makes it fp8s"
        return note

    def new_loop(self, *, share_passes: bool, floor_cache: int) -> EngineLoop:
        """An engine loop on this engine's model (``Engine.loop`` is the one every caller uses; tests make more)."""
        return EngineLoop(
            self.scorer,
            self.tokenizer,
            self.shape,
            parse=self._decoded,
            respond=self._respond,
            on_failure=self._failed,
            share_passes=share_passes,
            floor_cache=floor_cache,
            extractor=self.extractor,
            max_pass_s=self.max_pass_s,
        )

    @classmethod
    def from_settings(cls, settings) -> Engine:
        """The engine a server or ``spinf-serve score`` runs, from the layered settings (api spec §9)."""
        engine = settings.engine
        return cls(
            engine.model,
            device=engine.device,
            limits=settings.limits,
            token_budget=engine.token_budget,
            max_tokens=engine.max_tokens,
            quant=engine.quant,
            model_dir=engine.model_dir,
            cache_dirs=list(engine.cache_dirs) or None,
            revision=engine.revision,
            served_model=engine.served_model,
            model_id=engine.model_id,
            floor_cache=engine.floor_cache,
            features=settings.features.to_features(),
            compile=engine.compile,
            layers=engine.layers,
            lm_head=engine.lm_head,
            decode_budget_gib=engine.decode_budget_gib,
            decoder_budget_gib=engine.decoder_budget_gib,
            decode_graphs=engine.x_cuda_graphs,
            max_pass_s=engine.max_pass_s if _given(settings, "max_pass_s") else None,
        )

    @property
    def served_names(self) -> tuple[str, ...]:
        manifest_id = (self.resolved.manifest.id,) if self.resolved.manifest else ()
        return (self.served_name, *manifest_id, *self.aliases)

    def _fingerprint(self) -> str:
        """``fp_`` + 10 hex digits of sha256 over the parts of api spec §11, in order."""
        capability = self.capability()
        parts = [
            self.model_id,
            self.revision,
            self.quant,
            os.environ.get("GIT_SHA") or "unknown",
            __version__,
            capability,
            self.model.head_precision(),
        ]
        if self.quant == "fp8s":
            parts.append(self.scale_table)
        if self.layers:  # ours, beyond §11: the first N layers of a checkpoint are not its model
            parts.append(f"layers {self.layers}")
        return "fp_" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:10]

    def parse(self, body: object, *, chat: bool = False, trusted: bool = False, packs: object = None) -> ScoreRequest:
        """The checked request of a body (api spec §4), or `ApiError`; ``packs`` the pack catalog (None: off)."""
        return parse_score_request(
            body,
            chat=chat,
            served_names=self.served_names,
            model_media=self.media,
            limits=self.limits,
            features=self.features,
            trusted=trusted,
            packs=None if packs is None else PackStep(packs),
        )

    def _decoded(self, sent: Sent) -> ScoreRequest:
        """The loop's parse of a call `prepare` did not parse (timed as compile time by the loop)."""
        request = self.parse(sent.body, chat=sent.chat, trusted=sent.trusted, packs=sent.packs)
        return decode_media(request, self.image_scheme)

    def prepare(self, call: Call) -> Parsed:
        """Parses ``call`` and decodes its media (api spec §4.9 step 1) before the loop takes it: the request, or
        what refused it (the `ApiError` of a bad body), for `EngineLoop.add`. The server runs this in a worker
        thread for a call with media, so decoding never holds the event loop or the GPU thread; the loop parses
        every other call itself."""
        began = time.perf_counter()
        try:
            request = self._decoded(call.sent)
        except Exception as refusal:  # an ApiError, or a bug that fails this call only (the loop fails it)
            return Parsed(None, refusal, time.perf_counter() - began)
        return Parsed(request, None, time.perf_counter() - began)

    def _respond(self, scored: Scored) -> dict:
        """The response body of api spec §5.1 for a call the loop finished."""
        call, compiled = scored.call, scored.compiled
        req = compiled.request
        response = {"id": call.request_id, "object": "score", "created": int(time.time())}
        response["model"] = req.model if req.model is not None else self.served_name
        if req.endpoint is not None:
            response["endpoint"] = req.endpoint
        response["system_fingerprint"] = self.system_fingerprint
        response["results"] = scored.results
        response["warnings"] = compiled.warnings + scored.warnings
        if req.packs:
            response["warnings"] = add_pack_results(req.packs, scored.results, response["warnings"])
        response["usage"] = usage(compiled, scored.decoded)
        if call.sent.internals:
            response["usage"].update(_engine_counters(response["usage"], scored.ran_tokens))
        response["timing"] = {
            "wall_ms": round(scored.wall_s * 1000),
            "queue_ms": round(scored.queued_s * 1000),
            "compile_ms": round(scored.compile_s * 1000),
            "score_ms": round((scored.wall_s - scored.decode_s) * 1000),
            "gpu_busy_ms": round(scored.busy_s * 1000),
        }
        if any(cq.extracts for ci in compiled.inputs for cq in ci.queries):
            response["timing"]["decode_ms"] = round(scored.decode_s * 1000)
        if call.sent.internals:
            response["engine"] = self.info()
        if not self._idle_taken:  # the first call's passes allocated what the process keeps (IDLE_SLACK_BYTES)
            self._idle_bytes, self._idle_taken = self.scorer.allocated_bytes() or 0, True
        return response

    def capability(self) -> str:
        if self.device.type != "cuda":
            return "cpu"
        major, minor = torch.cuda.get_device_capability(self.device)
        return f"{major}.{minor}"

    def info(self) -> dict:
        """The engine object of ``/v0/info`` (api spec §3.6)."""
        import platform

        import transformers

        cuda = self.device.type == "cuda"
        return {
            "engine": __version__,
            "image": os.environ.get("GIT_SHA") or "unknown",
            "model": self.model_id,
            "revision": self.revision,
            "quant": self.quant,
            **({"scale_table": self.scale_table} if self.scale_table else {}),
            "lm_head": self.model.head_precision(),  # ours, beyond §3.6, as the next: part 7 of the fingerprint
            "batch_invariant": self.batch_invariant,
            "token_budget": self.shape.token_budget,
            "max_tokens": self.shape.max_tokens,
            "layers": len(self.model.layers),  # ours, beyond §3.6, as the next
            "cuda_graphs": self.scorer.graphs is not None,
            "gpu": torch.cuda.get_device_name(self.device) if cuda else "cpu",
            "capability": self.capability(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            **stack_versions(),  # ours, beyond §3.6: the rest of the numerics stack (constraints/*.txt pin it)
        }

    def idle_gib(self) -> float:
        """Device memory held while idle, in GiB (0 on the CPU)."""
        return round((self.scorer.allocated_bytes() or 0) / 2**30, 3)

    def settle(self) -> None:
        """Once warm: the model and the libraries leave the cyclic collector's scans (`spinf.engine.hostgc`)."""
        hostgc.settle()

    def warmup_bodies(self, mode: str) -> list[dict]:
        """The scoring calls of warm-up ``mode`` (`spinf.engine.warm.bodies`: two small calls unless ``none``)."""
        from spinf.engine import warm

        return warm.bodies(mode)

    def warmup_steps(self, mode: str) -> list:
        """The warm-up of ``mode`` as zero-argument steps, run one after another: `warmup_bodies` scored, then under
        ``full`` one built pass per CUDA-graph bucket and one of the whole token budget (`spinf.engine.warm`)."""
        from spinf.engine import warm

        return warm.steps(self, mode)

    def score(self, body: object, *, debug: bool = False, trusted: bool = False, packs: object = None) -> dict:
        """The response of spec §5 for a ``/v1/score`` body, or `ApiError`, through the engine loop.

        ``trusted`` honours the body's per-call ``limits`` and ``features`` (capped by the engine's own);
        ``debug`` adds the engine internals to the answer. The cyclic collector is paused for the whole call, and
        everything but the response is freed before it resumes (`spinf.engine.hostgc`).
        """
        call = Call(body, new_request_id(), trusted=trusted, internals=debug, packs=packs)
        with hostgc.paused():
            self.loop.run([call])
            return call.unwrap()

    def _failed(self, error: BaseException) -> BaseException:
        """The error a call whose pass raised ``error`` gets: running out of memory is 413 ``request_too_large``
        (api spec §4.9), given after the memory is freed and ``degraded`` checked; anything else as it is."""
        if not is_out_of_memory(error):
            return error
        self._recover(error)
        kind = "GPU memory" if self.device.type == "cuda" else "memory"
        refusal = ApiError(
            413, "request_too_large", None, f"out of {kind} while scoring this call; send fewer or shorter inputs"
        )
        refusal.__cause__ = error
        return refusal

    def _recover(self, error: BaseException) -> None:
        """Frees what the failed call held; marks the engine degraded if device memory is not back to idle."""
        # as text: a record holding the traceback would hold the failed passes' tensors (`Scorer.free_failed`)
        log.warning("out of memory while scoring:\n%s", "".join(traceback.format_exception(error)).rstrip())
        self.scorer.free_failed(error)
        now = self.scorer.allocated_bytes()
        held = 0 if now is None else now - self._idle_bytes  # the CPU's memory is not measured
        if held > IDLE_SLACK_BYTES and self.degraded is None:
            self.degraded = f"{held / 2**30:.2f} GiB still held after an out-of-memory error"
            log.error("engine degraded: %s", self.degraded)


# The numerics stack beside torch and transformers, by distribution: the kernels (triton; fla-core for the Qwen
# stack's linear attention), the tokenizer, the checkpoint reader and numpy, whose versions decide the scores.
_STACK = {"triton": "triton", "tokenizers": "tokenizers", "safetensors": "safetensors", "numpy": "numpy"}
_OPTIONAL_STACK = {"fla": "fla-core"}


def stack_versions() -> dict[str, str | None]:
    """The installed versions of `_STACK` (None for one not installed: triton off Linux) and of `_OPTIONAL_STACK`
    where installed, read from the distributions' metadata without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(distribution: str) -> str | None:
        try:
            return version(distribution)
        except PackageNotFoundError:
            return None

    versions = {key: installed(distribution) for key, distribution in _STACK.items()}
    optional = {key: installed(distribution) for key, distribution in _OPTIONAL_STACK.items()}
    return versions | {key: found for key, found in optional.items() if found is not None}
