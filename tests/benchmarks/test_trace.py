"""benchmarks/trace.py's report on a made-up trace: the GPU's busy time, its idle gaps, the host frames in them."""

import json

from benchmarks.trace import idle_lines


def _event(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_idle_gaps_and_the_frames_in_them(tmp_path):
    events = [
        _event("python_function", "score", 0, 1000),
        _event("python_function", "pass_plan", 100, 150),  # before the first kernel: 100 of its 150 us idle
        _event("cuda_runtime", "cudaLaunchKernel", 250, 5),
        _event("kernel", "gemm", 200, 300),  # 200..500
        _event("kernel", "norm", 450, 100),  # overlaps: busy until 550
        _event("cuda_runtime", "cudaStreamSynchronize", 560, 200),  # the host waits, the GPU idles 550..800
        _event("gpu_memcpy", "Memcpy DtoH", 800, 50),  # 800..850
        _event("kernel", "tiny", 860, 10),  # a 10 us gap: under the threshold
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 900},  # not a span
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    lines = idle_lines(path, min_gap_us=20)
    # busy: 200..550, 800..850, 860..870 = 410 us; idle between 200 and 870: 260 us, of it 250 in one gap
    assert lines[0] == (
        "host span 1.0 ms; GPU from 0.2 ms to 0.9 ms, busy 0.4 ms; idle in between 0.3 ms, of it 0.2 ms in 1 gaps"
        " of 20 us or more (largest 0.25 ms)"
    )
    frames = dict((line.split()[1], float(line.split()[0])) for line in lines[2:5])
    # score spans the lead (0..200), the gap (550..800) and the tail (870..1000): 580 us
    assert frames == {"score": 0.58, "cudaStreamSynchronize": 0.2, "pass_plan": 0.1}
    assert lines[-1].split() == ["1", "0.20", "cudaStreamSynchronize"]
