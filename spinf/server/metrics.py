"""Prometheus metrics (api spec §3.5, D8): requests by route and status, queue depth, tokens, pass time, warm-up.

Metrics carry no request content and no tokens. The registry is per server (not the global default), so tests can
run several servers in one process.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from spinf.server.lifecycle import InFlight, Lifecycle


class Metrics:
    def __init__(self) -> None:
        self.queued: Callable[[], int] = lambda: 0  # the packer's compiling + waiting calls, set by the wiring
        self.warmup: Callable[[], tuple[int, int]] = lambda: (0, 0)  # the warm-up's (steps, passes), set likewise
        # the pack catalog in use and the reloads: (enabled versions, enabled ids, reloads applied, refused)
        self.packs: Callable[[], tuple[int, int, int, int]] = lambda: (0, 0, 0, 0)
        self.engine_thread: Callable[[], tuple[int, float]] = lambda: (0, 0.0)  # the executor's (jobs, busy s)
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("spinf_requests", "Answered requests", ["route", "status"], registry=r)
        # ours, beyond §3.5: admitted calls cancelled because their client went away (access-logged as 499)
        self.abandoned_calls = Counter(
            "spinf_requests_abandoned", "Admitted calls whose client left before the answer", ["route"], registry=r
        )
        self.queue_depth = Gauge("spinf_queue_depth", "Admitted requests waiting for the GPU", registry=r)
        self.in_flight = Gauge("spinf_requests_in_flight", "Admitted requests, waiting or being scored", registry=r)
        self.processed = Counter("spinf_processed_tokens", "Sum of usage.processed_tokens", registry=r)
        self.prompt = Counter("spinf_prompt_tokens", "Sum of usage.prompt_tokens", registry=r)
        self.completion = Counter("spinf_completion_tokens", "Sum of usage.completion_tokens", registry=r)
        self.questions = Counter(
            "spinf_questions", "Questions answered: usage.scoring.prompts plus usage.extraction.slots", registry=r
        )
        self.media = Counter("spinf_media_items", "Images and video frames read", ["kind"], registry=r)
        self.audio = Counter("spinf_audio_seconds", "Seconds of audio read (usage.content.audio_seconds)", registry=r)
        self.device_bytes = Gauge(
            "spinf_gpu_memory_bytes", "Device memory the engine holds after its last step (GPU only)", registry=r
        )
        self.pass_seconds = Histogram("spinf_pass_seconds", "Duration of each forward pass", registry=r)
        self.warm = Gauge("spinf_warm", "1 once loaded and warm", registry=r)
        self.load_failed = Gauge("spinf_load_failed", "1 if the load or the warm-up failed", registry=r)
        self.warmup_seconds = Gauge("spinf_warmup_seconds", "boot.warmup_s once known", registry=r)
        # ours, beyond §3.5: what the warm-up ran (its passes are not in spinf_pass_seconds)
        self.warmup_steps = Gauge("spinf_warmup_steps", "Warm-up steps run (scoring calls, built passes)", registry=r)
        self.warmup_passes = Gauge("spinf_warmup_passes", "Forward passes the warm-up ran", registry=r)
        # ours, beyond §3.5: the floor cache across requests (a hit: a key served from it or from a read under way)
        self.floor_hits = Counter("spinf_floor_cache_hits", "Floor keys not read again", registry=r)
        self.floor_misses = Counter("spinf_floor_cache_misses", "Floor keys read in passes", registry=r)
        self.floor_entries = Gauge("spinf_floor_cache_entries", "Floor keys in the cache", registry=r)
        # ours, beyond §3.5: the pack catalog in use and its reloads (SIGHUP, POST /v0/packs/reload)
        self.pack_versions = Gauge("spinf_pack_versions", "Enabled pack versions in the catalog in use", registry=r)
        self.pack_ids = Gauge("spinf_packs", "Enabled pack ids in the catalog in use", registry=r)
        self.pack_reloads = Gauge("spinf_pack_reloads", "Pack reloads run, by result", ["result"], registry=r)
        # ours, beyond §3.5: the one thread that runs every torch call (loading, warm-up, loop steps)
        self.thread_jobs = Gauge("spinf_engine_thread_jobs", "Jobs the engine thread has run", registry=r)
        self.thread_busy = Gauge(
            "spinf_engine_thread_busy_seconds", "Seconds the engine thread has spent running jobs", registry=r
        )
        self._floors_seen = (0, 0)

    def request(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(status)).inc()

    def abandoned(self, route: str) -> None:
        self.abandoned_calls.labels(route=route).inc()

    def usage(self, usage: dict) -> None:
        self.processed.inc(usage.get("processed_tokens", 0))
        self.prompt.inc(usage.get("prompt_tokens", 0))
        self.completion.inc(usage.get("completion_tokens", 0))
        scoring, extraction = usage.get("scoring") or {}, usage.get("extraction") or {}
        self.questions.inc(scoring.get("prompts", 0) + extraction.get("slots", 0))
        content = usage.get("content") or {}
        for kind, key in (("image", "images"), ("video_frame", "video_frames")):
            if content.get(key):
                self.media.labels(kind=kind).inc(content[key])
        self.audio.inc(content.get("audio_seconds", 0.0))

    def run(self, run) -> None:
        """One engine-loop step: the device time of each pass it read back, and the floor cache's counts."""
        for _, busy_s in run.passes:
            self.pass_seconds.observe(busy_s)
        hits, misses = self._floors_seen
        self.floor_hits.inc(run.floor_hits - hits)
        self.floor_misses.inc(run.floor_misses - misses)
        self.floor_entries.set(run.floor_entries)
        self._floors_seen = (run.floor_hits, run.floor_misses)
        if run.device_bytes is not None:
            self.device_bytes.set(run.device_bytes)

    def render(self, lifecycle: Lifecycle, in_flight: InFlight) -> str:
        self.queue_depth.set(self.queued())
        self.in_flight.set(in_flight.count)
        self.warm.set(1 if lifecycle.is_warm else 0)
        self.load_failed.set(1 if lifecycle.error else 0)
        if lifecycle.boot is not None and lifecycle.boot.warmup_s is not None:
            self.warmup_seconds.set(lifecycle.boot.warmup_s)
        steps, passes = self.warmup()
        self.warmup_steps.set(steps)
        self.warmup_passes.set(passes)
        jobs, busy_s = self.engine_thread()
        self.thread_jobs.set(jobs)
        self.thread_busy.set(busy_s)
        versions, ids, applied, refused = self.packs()
        self.pack_versions.set(versions)
        self.pack_ids.set(ids)
        self.pack_reloads.labels(result="applied").set(applied)
        self.pack_reloads.labels(result="refused").set(refused)
        return generate_latest(self.registry).decode()
