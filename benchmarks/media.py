"""Issue 16's measurement: questions/s with media on the 12B shape, the share of decoding and embedding, and memory.

Run on the GPU machine: ``python benchmarks/media.py [--work DIR]``; under a memory cap (a second process, after
the first wrote the folder and its scale table): ``python benchmarks/media.py --work DIR --cap-gib 24``. The CPU
smoke test is ``python benchmarks/media.py --device cpu --scaled --inputs 2 --clips 1``.

1. The 12B shape with random bf16 weights and the 12B's media embedders (the vision embedder 3,840 wide, the audio
   projection) as a checkpoint folder (`benchmarks.checkpoint`, ``media=True``), calibrated on text and served in
   fp8s as ``spinf-serve serve`` would; the embedders run in bf16.
2. Calls, each timed as the median of ``--repeats`` after a warm one (`Engine.score` in-process, trusted):
   * ``--inputs`` inputs of one 640 × 480 JPEG photo (auto detail: 266 blocks) and a sentence × ``--questions``
     yes/no questions, and the same inputs without the image (what the image's tokens cost);
   * ``--clips`` inputs of ``--seconds`` s of audio (16 kHz WAV) × ``--questions`` questions.
3. For each media call, the time of its parts on their own: decoding (`spinf.media.items.decode_media` on the
   parsed body, what a server's worker threads do beside the GPU) and embedding (`MediaEmbedders.embed` of the
   call's items, synchronised), as shares of the call's time.
4. Peak GPU memory over the run; with ``--cap-gib`` the process may use that much of the card
   (``torch.cuda.set_per_process_memory_fraction``) and loads the shipped scale table instead of calibrating.

One section goes to benchmarks/RESULTS.md (``--no-results`` prints only).
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from benchmarks.baseline import BENCH_LIMITS  # noqa: E402
from benchmarks.checkpoint import calibrate_folder, open_engine, work_dir, write_checkpoint  # noqa: E402
from benchmarks.extraction import QUESTIONS, timed  # noqa: E402
from benchmarks.gemma12b import GEMMA_12B_TEXT_CONFIG, scaled  # noqa: E402
from benchmarks.gpu_fast import calibration_corpus  # noqa: E402
from benchmarks.results import RESULTS, append_section, cpu_machine  # noqa: E402
from spinf.engine.scales import SHIPPED_TABLE  # noqa: E402
from spinf.media.items import decode_media  # noqa: E402

SENTENCE = "The customer attached this to the ticket about the late delivery."


def queries(n: int) -> list[dict]:
    return [
        {
            "id": f"q{k}",
            "template": f"\n\nQuestion {k}: {QUESTIONS[k % len(QUESTIONS)]}? Answer:{{?}}",
            "options": [" yes", " no"],
        }  # fmt: skip
        for k in range(n)
    ]


def photo(seed: int) -> dict:
    """A 640 x 480 JPEG of smooth random colour fields (a photo-like file, ~40 KB), as a data URL part."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)
    pixels = np.asarray(Image.fromarray(small).resize((640, 480), Image.Resampling.BICUBIC))
    noisy = np.clip(pixels + rng.normal(0, 8, pixels.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noisy).save(buffer, "JPEG", quality=90)
    url = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def clip(seconds: float, seed: int) -> dict:
    from tests.media.fixtures import wav_header

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16_000)) / 16_000
    tone = 3000 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + rng.normal(0, 500, t.shape)
    pcm = tone.astype("<i2").tobytes()
    data = base64.b64encode(wav_header(16_000, 1, len(pcm), pcm)).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def body(contents: list[list[dict]], n_questions: int) -> dict:
    inputs = [{"id": f"i{k}", "messages": [{"role": "user", "content": c}]} for k, c in enumerate(contents)]
    return {"inputs": inputs, "scoring": {"queries": queries(n_questions)}}


def parts_time(engine, call: dict, repeats: int, device: torch.device) -> tuple[float, float]:
    """The median seconds of decoding the call's media, and of embedding its items (synchronised)."""
    request = engine.parse(call, trusted=True)
    decode_s, embed_s = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        decoded = decode_media(request)
        decode_s.append(time.perf_counter() - started)
        items = [item for inp in decoded.inputs for seg in inp.segments if not isinstance(seg, str)
                 for item in seg.decoded if not isinstance(item, str)]  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        engine.embedders.embed(items)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        embed_s.append(time.perf_counter() - started)
    return statistics.median(decode_s), statistics.median(embed_s)


def decode_alone(call: dict, repeats: int) -> float:
    """The median seconds of decoding ``call``'s media in a process that has loaded nothing else yet."""
    from spinf.protocol.request import parse_score_request

    request = parse_score_request(call, model_media=frozenset({"image", "audio", "video"}))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        decode_media(request)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--scaled", action="store_true", help="a 2-layer, 64-wide model of the 12B's architecture")
    p.add_argument("--work", type=Path, default=None, help="where the checkpoint folder goes (default: temporary)")
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--clips", type=int, default=16)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--questions", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cap-gib", type=float, default=0.0, help="run under this much GPU memory (0: the whole card)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-results", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    config = scaled(GEMMA_12B_TEXT_CONFIG) if args.scaled else GEMMA_12B_TEXT_CONFIG
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    if args.cap_gib and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total, index)
        say(f"GPU memory capped at {args.cap_gib:g} GiB of {total / 2**30:.1f} GiB")
    images = body([[photo(k), {"type": "text", "text": SENTENCE}] for k in range(args.inputs)], args.questions)
    text = body([[{"type": "text", "text": SENTENCE}] for _ in range(args.inputs)], args.questions)
    sound = body([[clip(args.seconds, k)] for k in range(args.clips)], args.questions)
    alone = {"photos": decode_alone(images, args.repeats), "audio": decode_alone(sound, args.repeats)}
    say(
        f"decoding before anything else is loaded: the photos {alone['photos'] * 1000:.1f} ms, the audio "
        f"{alone['audio'] * 1000:.1f} ms"
    )
    with work_dir(args.work) as root:
        folder = write_checkpoint(root, config, device=device, media=True)
        quant = "fp32"
        if folder.on_gpu:
            quant = "fp8s"
            if not (folder.path / SHIPPED_TABLE).exists():
                calibrate_folder(folder, root, calibration_corpus(), BENCH_LIMITS)
        engine = open_engine(folder, root, quant=quant, limits=BENCH_LIMITS)
        if device.type == "cuda":
            for module in (engine.embedders.vision, engine.embedders.audio):
                module.to(torch.bfloat16)  # the checkpoint's dtype already: a no-op kept for a float folder
            torch.cuda.reset_peak_memory_stats(device)
        say(f"model loaded: {engine.info()['gpu']}, {quant}; media read: {sorted(engine.features.media)}")
        say("")
        say("| call | questions | content tokens (media) | processed tokens | ms | questions/s | decode ms (share) "
            "| embed ms (share) |")  # fmt: skip
        say("|---|---|---|---|---|---|---|---|")
        for name, call, media in (
            (f"{args.inputs} × one photo (auto) + a sentence", images, True),
            (f"{args.inputs} × the sentence alone", text, False),
            (f"{args.clips} × {args.seconds:g} s audio", sound, True),
        ):
            seconds, response = timed(engine, call, args.repeats, device)
            usage = response["usage"]
            content = usage["content"]
            media_tokens = content["image_tokens"] + content["audio_tokens"]
            questions = len(call["inputs"]) * args.questions
            decode, embed = parts_time(engine, call, args.repeats, device) if media else (0.0, 0.0)
            say(
                f"| {name} | {questions} | {content['tokens']} ({media_tokens}) | {usage['processed_tokens']} | "
                f"{seconds * 1000:.1f} | {questions / seconds:.0f} | {decode * 1000:.1f} ({decode / seconds:.0%}) | "
                f"{embed * 1000:.1f} ({embed / seconds:.0%}) |"
            )
        if device.type == "cuda":
            say("")
            say(f"peak GPU memory over the calls: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB "
                f"(allocated; reserved {torch.cuda.max_memory_reserved(device) / 2**30:.2f} GiB)")  # fmt: skip
    if args.no_results:
        return
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_machine()
    command = "python benchmarks/media.py " + " ".join(argv if argv is not None else sys.argv[1:])
    title = "Issue 16: media" + (f" under a {args.cap_gib:g} GiB cap" if args.cap_gib else "")
    append_section(title, f"`{command}` on {machine}\n\n" + "\n".join(lines) + "\n", args.results)


if __name__ == "__main__":
    main()
