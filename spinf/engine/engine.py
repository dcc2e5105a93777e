"""The library entry point: ``Engine(model, device).score(body)`` answers a ``/v1/score`` body in-process.

It opens the model in one place (`spinf.engine.opening.open_model`: the checks, the checkpoint, the scheme, the
stack and its embedders), then assembles the runner in a straight line (tokenizer, scorer, extractor, shape, loop).
A call goes through it in straight-line order: parse the body (`spinf.protocol`), compile it against the
tokenizer (`spinf.engine.compiler`), run the jobs (`spinf.engine.scorer`), and assemble the response
(`spinf.engine.results`). Request problems raise `ApiError` with the spec's status, code and param; running out of
memory during a call's passes is one of them (413 ``request_too_large``, api spec §4.9), after which the engine
either is back at its idle memory or says it is ``degraded`` (§3.2).
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path

import attrs
import torch

from spinf._version import __version__
from spinf.catalog import ResolvedModel, resolve_model
from spinf.catalog.manifest import TINY_REPO
from spinf.engine import hostgc, identity, warm
from spinf.engine.compiler import EngineShape
from spinf.engine.extractor import Extractor, cpu_context
from spinf.engine.hardware import INT4_PREFIX
from spinf.engine.loop import EngineLoop
from spinf.engine.opening import engine_settings, eos_ids, open_model
from spinf.engine.results import usage
from spinf.engine.scales import CALIBRATE_COMMAND
from spinf.engine.scorer import Scorer, is_out_of_memory
from spinf.engine.tokenizer import TextTokenizer
from spinf.engine.work import Call, Parsed, Scored, Sent
from spinf.errors import ApiError
from spinf.media.items import decode_media
from spinf.packs.calls import PackStep
from spinf.packs.responses import add_pack_results
from spinf.protocol.ids import new_request_id
from spinf.protocol.request import parse_score_request
from spinf.protocol.types import ScoreRequest
from spinf.settings import SETTING, SETTINGS, EngineSettings, Features, Limits

log = logging.getLogger(__name__)
# The engine settings `Engine` takes by name (api spec §9.2): the engine section's, but the model (its first
# argument), the warm-up mode (the warm-up actor's) and the reference's settings that have no effect here.
ENGINE_ARGS = tuple(
    s.name for s in SETTINGS if s.section == "engine" and not s.no_effect and s.name not in ("model", "warmup")
)
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


def _given(settings, name: str) -> bool:
    """Whether ``name`` was set, in any layer or by building the settings with another value than its default."""
    return settings.origin(name) != "default" or settings.value(name) != SETTING[name].default


def round_up(n: int, multiple: int = 128) -> int:
    return -(-n // multiple) * multiple


def batch_invariant(resolved: ResolvedModel, device: torch.device, quant: str) -> bool:
    """Whether concurrent calls may share passes: only under a batch-invariant scheme, and only for a catalog model
    (a checkpoint outside the catalog carries no guarantee, api spec §9.6). fp32 on the CPU is bitwise row-invariant
    (tests/engine/test_independence.py). fp8s on a GPU is invariant by the design of engine spec B.10 (static
    scales, aligned jobs, shape-stable GEMMs), and so is the Qwen3.5 stack's int4-i8 on a GPU (B.10 item 8: int8
    products exact in int32 with fixed-order block sums and row-wise epilogues, row-wise activation quantizers, the
    recurrence by segment and each fixed prefix chunked from its BOS, the LM head in fixed row chunks); both rest on
    the GPU kernels being built alongside this, and only the gpu-marked tests and `benchmarks/qwen35.py
    --invariance` check them. bf16 and the other GPU schemes (int4-f16, -fp8 and -bf16 among them) are not
    invariant."""
    cpu_fp32 = device.type == "cpu" and quant == "fp32"
    gpu_fp8s = device.type == "cuda" and quant == "fp8s"
    gpu_int4_i8 = device.type == "cuda" and quant == INT4_PREFIX + "i8"
    return resolved.batch_invariant and (cpu_fp32 or gpu_fp8s or gpu_int4_i8)


def pass_bound(max_pass_s: float | None, device: torch.device) -> float:
    """The time bound of a call's pass (spinf.engine.scheduler). Unless given, a CPU's passes keep to the settings
    table's default: a full pass there takes seconds. A GPU's full pass takes a fraction of a second on the 12B but
    over one on the Qwen 27B, whose fixed cost per pass would then be paid several times a budget (measured on the
    H200: 163 ms for a 300-token call), so its passes keep to the token budget only (0)."""
    if max_pass_s is not None:
        return max_pass_s
    return SETTING["max_pass_s"].default if device.type == "cpu" else 0.0


class Engine:
    """One loaded model and everything needed to score requests on it, synchronously.

    ``degraded`` is None while healthy; after an out-of-memory error that left device memory above the idle figure
    it says how much is still held, and stays set (api spec §3.2: the server reports it and exits).
    """

    def __init__(
        self,
        model: str | None = TINY_REPO,
        *,
        device: str = "cpu",
        limits: Limits | None = None,
        features: Features | None = None,
        cache_dir: str | Path | None = None,
        max_pass_s: float | None = None,
        resolved: ResolvedModel | None = None,
        **given,
    ):
        """``model`` as ``spinf-serve serve`` takes it (api spec §9.6), unless ``resolved`` is that model resolved
        already (the command line resolves it once, for its settings). ``given``: any other engine setting by its
        name (§9.2: ``quant``, ``token_budget``, ``max_tokens``, ``cache_dirs``, ``layers``, ``compile`` ...); one
        not given is the model's manifest's, else the settings table's default (`engine_settings`). ``cache_dir``
        is searched before ``cache_dirs``; ``max_pass_s`` None: by device (`pass_bound`). ``features`` are the
        server's switches, narrowed here to what the model does."""
        if cache_dir is not None:
            given["cache_dirs"] = [str(cache_dir), *(given.get("cache_dirs") or ())]
        resolved = resolved or resolve_model(model)
        settings = engine_settings(resolved, device, given)
        opened = open_model(resolved, settings, features or Features())
        self.resolved, self.quant, self.scale_table = opened.resolved, opened.quant, opened.scale_table
        self.model, self.embedders = opened.model, opened.embedders
        self.media, self.features = opened.media, opened.features  # what it reads; the switches narrowed to it
        checkpoint = opened.checkpoint
        self.folder, self.revision, self.weights = checkpoint.folder, checkpoint.revision, checkpoint.weights
        self.family = checkpoint.family
        # the served_model and model_id settings override what the manifest set (api spec §9.2)
        self.model_id = settings.model_id or self.resolved.model_id
        self.served_name = settings.served_model or self.resolved.served_name
        self.aliases = tuple(self.resolved.aliases)
        self.device = torch.device(device)
        self.image_scheme = "qwen" if self.family == "qwen35" else "gemma"  # `spinf.media.items.SCHEMES`
        self.limits = limits or Limits()
        if opened.decider:  # api spec §9.4: the decider forces max_extractions_per_input to 0
            self.limits = attrs.evolve(self.limits, max_extractions_per_input=0)
        # only a truncated model names its layer count in the fingerprint: its scores are another model's
        self.layers = settings.layers and len(self.model.layers)
        self.tokenizer = TextTokenizer.from_folder(self.folder)
        # compile = false (--no-compile): every pass runs eagerly, no CUDA graph is captured (a GPU's only compile)
        self.scorer = Scorer(self.model, self.device, graphs=settings.compile, embedders=self.embedders)
        self.degraded: str | None = None
        # Device memory while idle: taken here, then once more when the first call succeeds (in the server, the
        # first warm-up shape), since a first pass allocates what the process keeps (see IDLE_SLACK_BYTES).
        self._idle_bytes = self.scorer.allocated_bytes() or 0
        self._idle_taken = False
        self.system_fingerprint = self._fingerprint()
        self.batch_invariant = batch_invariant(self.resolved, self.device, self.quant)
        self._log_start()
        # extraction slots decode from what their scoring pass kept (spinf.engine.extractor); none when switched off
        self.extractor = self._extractor(settings) if self.features.extraction else None
        self.shape = EngineShape(
            round_up(settings.token_budget),
            round_up(settings.max_tokens),
            capture_tokens=self.extractor.capture_tokens() if self.extractor else 0,
            capture_cost=self.extractor.cost if self.extractor else None,
            media_tokens=opened.media_tokens,
            media_kinds=self.features.media & self.embedders.kinds if self.embedders else frozenset(),
            answer_codes=opened.answer_codes,
        )
        self.max_pass_s = pass_bound(max_pass_s, self.device)
        # every caller's work reaches the device through this one loop (spinf.engine.loop)
        self.loop = self.new_loop(share_passes=self.batch_invariant, floor_cache=settings.floor_cache)

    def _extractor(self, settings: EngineSettings) -> Extractor:
        cuda = self.device.type == "cuda"
        return Extractor(
            self.model,
            self.tokenizer,
            eos_ids(self.folder, self.model.cfg),
            decode_budget_gib=settings.decode_budget_gib,
            decoder_budget_gib=settings.decoder_budget_gib,
            kernel_plan=self.scorer.decode_plan if cuda else None,
            context=cpu_context(self.device),
            # decode steps replay CUDA graphs unless --no-compile or x_cuda_graphs = false (a graph replays the
            # same kernels, so this changes speed only)
            graphs=settings.compile and settings.x_cuda_graphs and cuda,
        )

    def _log_start(self) -> None:
        log.info(
            "serving %s (%s @ %s, %s%s on %s, layers %d, CUDA graphs %s): system_fingerprint %s",
            self.served_name,
            self.model_id,
            self.revision,
            self.quant,
            f" with scale table {self.scale_table}" if self.scale_table else "",
            self.device,
            len(self.model.layers),
            "on" if self.scorer.graphs is not None else "off",
            self.system_fingerprint,
        )
        log.info("scores are %s", self._invariance_note())

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
    def from_settings(cls, settings, *, resolved: ResolvedModel | None = None) -> Engine:
        """The engine a server or ``spinf-serve score`` runs, from the layered settings (api spec §9): each of
        `ENGINE_ARGS` by its name, ``max_pass_s`` only when given (else by device). ``resolved``: the model the
        settings name, resolved already (None: resolved here)."""
        given = {name: settings.value(name) for name in ENGINE_ARGS}
        given["max_pass_s"] = given["max_pass_s"] if _given(settings, "max_pass_s") else None
        features = settings.features.to_features()
        return cls(settings.engine.model, resolved=resolved, limits=settings.limits, features=features, **given)

    @property
    def served_names(self) -> tuple[str, ...]:
        manifest_id = (self.resolved.manifest.id,) if self.resolved.manifest else ()
        return (self.served_name, *manifest_id, *self.aliases)

    def _fingerprint(self) -> str:
        """``fp_`` + 10 hex digits of sha256 over the parts of api spec §11, in order (`identity.fingerprint`)."""
        return identity.fingerprint(
            model_id=self.model_id,
            revision=self.revision,
            quant=self.quant,
            device=self.device,
            head=self.model.head_precision(),
            scale_table=self.scale_table,
            layers=self.layers,
        )

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
        return identity.capability(self.device)

    def info(self) -> dict:
        """The engine object of ``/v0/info`` (api spec §3.6): the model's fields, then the platform's."""
        return {
            "engine": __version__,
            "image": identity.image(),
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
            **identity.platform_info(self.device),
        }

    def idle_gib(self) -> float:
        """Device memory held while idle, in GiB (0 on the CPU)."""
        return round((self.scorer.allocated_bytes() or 0) / 2**30, 3)

    def settle(self) -> None:
        """Once warm: the model and the libraries leave the cyclic collector's scans (`spinf.engine.hostgc`)."""
        hostgc.settle()

    def warmup_steps(self, mode: str) -> list[warm.Step]:
        """The warm-up of ``mode`` as zero-argument steps, run one after another: its scoring calls, then under
        ``full`` one built pass per CUDA-graph bucket and one of the whole token budget (`spinf.engine.warm`)."""
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
