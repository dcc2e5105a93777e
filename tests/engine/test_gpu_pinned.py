"""Host arrays to the GPU through the reused pinned halves (`spinf.engine.pinned`), gpu-marked: every array arrives
whole, of its dtype and shape, even when the stream is far behind and the halves turn over many times; arrays larger
than a half take a buffer of their own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spinf.engine.pinned import PinnedStager, stager

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def arrays(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    kinds = [
        lambda n: rng.integers(-(2**40), 2**40, size=n, dtype=np.int64),
        lambda n: rng.integers(-1000, 1000, size=(n, 3), dtype=np.int32),
        lambda n: rng.random(n) < 0.5,
        lambda n: rng.standard_normal((2, n)).astype(np.float32),
    ]
    return [kinds[i % len(kinds)](int(rng.integers(0, 40))) for i in range(count)]


def test_arrays_arrive_whole_while_the_stream_is_behind():
    device = torch.device("cuda", torch.cuda.current_device())
    small = PinnedStager(device, half_bytes=1024)  # a few arrays a half: the halves turn over many times
    sent = arrays(200)
    torch.cuda._sleep(200_000_000)  # the copies queue behind this: a half reused early would be overwritten
    got = [small.to_device(a) for a in sent]
    torch.cuda.synchronize()
    for a, t in zip(sent, got, strict=True):
        assert t.device == device and t.dtype == torch.from_numpy(a).dtype and tuple(t.shape) == a.shape
        assert np.array_equal(t.cpu().numpy(), a)


def test_into_a_buffer_a_large_array_and_the_shared_stager():
    device = torch.device("cuda", torch.cuda.current_device())
    small = PinnedStager(device, half_bytes=1024)
    large = np.arange(5000, dtype=np.int64)  # past a half: its own pinned buffer
    target = torch.zeros(5000, dtype=torch.long, device=device)
    small.copy_into(target, large)
    strided = np.arange(60, dtype=np.int32).reshape(6, 10)[:, ::2]  # made contiguous on the way
    into = torch.zeros((6, 5), dtype=torch.int32, device=device)
    small.copy_into(into, strided)
    torch.cuda.synchronize()
    assert torch.equal(target.cpu(), torch.from_numpy(large))
    assert np.array_equal(into.cpu().numpy(), strided)
    assert stager(torch.device("cuda")) is stager(device)  # one per device, whichever way it is named
