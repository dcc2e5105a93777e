"""A refused start downloads nothing (issue 12, item 1): every refusal that the manifest, the settings and the device
decide comes before the checkpoint's lookup, against a fake Hub on loopback that records every request it gets.

Each refused start here has what it needs to reach the Hub: ``HF_ENDPOINT`` (and huggingface_hub's endpoint in this
process) is the fake, ``HF_HOME`` an empty folder of the test's own, ``HF_HUB_OFFLINE`` unset. The starts that pass
the checks fetch from the same fake, which shows it is the one a download would reach. A GPU is faked by replacing
`spinf.engine.opening.device_facts`, as tests/engine/test_scales.py does.
"""

from __future__ import annotations

import pytest
import torch

from spinf.catalog import load_catalog, resolve_model
from spinf.engine import opening as engine_module
from spinf.engine.gemma4.tiny import TINY_REVISION, snapshot_files
from spinf.engine.hardware import GIB, DeviceFacts
from spinf.engine.scales import store_path, write_table
from spinf.errors import ConfigError, ModelError

from .hub import FakeHub, run_serve

REPO = "acme/tiny-copy"  # a Hub repo outside the catalog: the tiny model's files, served by the fake Hub
PINNED = "acme/tiny-bf16"  # a catalog model (an extra manifest) whose checkpoint the fake Hub serves too
BIG = "acme/big-bf16"
INT4 = "acme/gemma-int4"
REVISION = "0123456789abcdef0123456789abcdef01234567"
GPU_ONLY = "needs a CUDA GPU. To try the API without a GPU: spinf-serve serve spinf/tiny-gemma4 --device cpu"


@pytest.fixture(scope="module")
def tiny_files() -> dict[str, bytes]:
    return snapshot_files()


@pytest.fixture
def hub(monkeypatch, tiny_files):
    """The fake Hub as this process's Hub, serving the tiny model's files as ``REPO`` and as ``PINNED``."""
    with FakeHub({REPO: REVISION, PINNED: REVISION}, {REPO: tiny_files, PINNED: tiny_files}) as fake:
        fake.serve_here(monkeypatch)
        yield fake


@pytest.fixture
def manifests(tmp_path, monkeypatch):
    """Extra catalog models, each pinned at ``REVISION`` with its size: ``PINNED`` (the tiny model's files in bf16's
    clothes, served by the fake Hub), ``BIG`` (20 GB in bf16, not on the fake Hub) and ``INT4`` (a Gemma 4 in int4,
    whose schemes this build does not run)."""
    folder = tmp_path / "manifests"
    folder.mkdir()
    for repo, weight_format, size in [
        (PINNED, "safetensors-bf16", 3_392_408),
        (BIG, "safetensors-bf16", 20_000_000_000),
        (INT4, "gptq-int4-g32", 6_000_000_000),
    ]:
        (folder / f"{repo.split('/')[1]}.toml").write_text(
            f'id = "{repo}"\nname = "{repo}"\nfamily = "gemma4"\n[source]\nrepo = "{repo}"\n'
            f'revision = "{REVISION}"\nformat = "{weight_format}"\nbytes = {size}\n'
        )
    monkeypatch.setenv("SPINF_MANIFEST_DIRS", str(folder))


def on_gpu(monkeypatch, capability=(9, 0), free_gib=80.0) -> None:
    facts = DeviceFacts(device="cuda:0", name="fake GPU", capability=capability, free_bytes=int(free_gib * GIB))
    monkeypatch.setattr(engine_module, "device_facts", lambda device: facts)


def start(model: str | None, device: str = "cuda:0", **settings):
    return engine_module.open_checkpoint(resolve_model(model), device=device, **settings)


def test_the_default_model_on_the_cpu(hub):
    with pytest.raises(ModelError, match=rf"^spinf/gemma-4-12b-fp8 {GPU_ONLY}$"):
        start(None, device="cpu")
    assert hub.requests == []


def test_the_default_model_on_a_gpu_that_could_run_it_goes_to_the_hub_for_its_files(hub, monkeypatch):
    """The issue's case: nothing refuses the 12B's fp8-static checkpoint on a capable GPU, so the start asks the Hub
    for it (the fake one has no such repo: the lookup fails after the request, naming what was missing)."""
    on_gpu(monkeypatch)
    with pytest.raises(
        ModelError, match=r"^the checkpoint spinf/gemma-4-12b-fp8 at revision a689df2c\w+ is not in any"
    ):
        start(None)
    assert any("spinf/gemma-4-12b-fp8" in request for request in hub.requests)


def test_fp8_before_compute_capability_8_9(hub, monkeypatch):
    on_gpu(monkeypatch, capability=(8, 6))
    with pytest.raises(
        ConfigError,
        match=r"^quant 'fp8' needs compute capability 8\.9 or later; cuda:0 \(fake GPU\) has 8\.6\. Choose another "
        r"scheme with --quant \(w8a16, w8a8, bf16\)$",
    ):
        start("spinf-12b", quant="fp8")
    assert hub.requests == []


def test_too_little_memory_for_the_manifests_size(hub, monkeypatch):
    on_gpu(monkeypatch, free_gib=16)
    with pytest.raises(
        ModelError,
        match=r"^spinf/gemma-4-12b-fp8 in fp8s does not fit on cuda:0 \(fake GPU\): it needs about 19\.3 GiB \(1\.1 × "
        r"12\.1 GiB of weights \+ 6 GiB of work buffers\), and 16\.0 GiB are free$",
    ):
        start(None)
    assert hub.requests == []


def test_the_manifests_size_is_its_pinned_revisions(hub, monkeypatch):
    """Another revision has a size of its own, known only from its files: no memory refusal before the lookup, so
    the start asks the Hub for that revision (where 16 GiB would have refused the pinned one, the test above)."""
    on_gpu(monkeypatch, free_gib=16)
    with pytest.raises(ModelError, match=r"^the checkpoint spinf/gemma-4-12b-fp8 at revision c{40} is not in any"):
        start(None, revision="c" * 40)
    assert any("c" * 40 in request for request in hub.requests)


@pytest.mark.parametrize("model", ["qwen3.8-27b-s", "spinf/pplx-decider-v1-27b-int4"])
def test_a_qwen35_catalog_model_needs_a_gpu(hub, monkeypatch, model):
    on_gpu(monkeypatch)
    name = load_catalog().find(model).id
    with pytest.raises(ModelError, match=rf"^{name} {GPU_ONLY}$"):
        start(model, device="cpu")
    assert hub.requests == []


@pytest.mark.parametrize("model", ["qwen3.8-27b-s", "spinf/pplx-decider-v1-27b-int4"])
def test_a_qwen35_catalog_model_in_a_gemma_scheme(hub, monkeypatch, model):
    on_gpu(monkeypatch)
    name = load_catalog().find(model).id
    with pytest.raises(
        ConfigError, match=rf"^quant 'fp8s' cannot run {name} on cuda:0: allowed are i8, f16, fp8, bf16$"
    ):
        start(model, quant="fp8s")
    assert hub.requests == []


@pytest.mark.parametrize("model", ["qwen3.8-27b-s", "spinf/pplx-decider-v1-27b-int4"])
def test_a_qwen35_catalog_model_on_a_gpu_goes_on_to_the_lookup(hub, monkeypatch, model):
    """Its stack is built: with a GPU and room for it, nothing refuses the start before the lookup."""
    on_gpu(monkeypatch)
    name = load_catalog().find(model).id
    with pytest.raises(ModelError, match=rf"^the checkpoint {name} at revision [0-9a-f]{{40}} is not in any"):
        start(model)
    assert any(name in request for request in hub.requests)


def test_a_scheme_the_manifest_does_not_allow(hub, monkeypatch):
    on_gpu(monkeypatch)
    with pytest.raises(
        ConfigError,
        match=r"^quant 'i8' cannot run spinf/gemma-4-12b-fp8 on cuda:0: allowed are fp8s, fp8, fp8row, w8a16, w8a8, "
        r"bf16$",
    ):
        start("spinf-12b", quant="i8")
    assert hub.requests == []


def test_a_scheme_this_build_cannot_run(hub, monkeypatch, manifests):
    on_gpu(monkeypatch)
    with pytest.raises(ModelError, match=rf"^{INT4}: the int4-i8 scheme runs GPTQ checkpoints of the Qwen3.5 stack "):
        start(INT4)
    assert hub.requests == []


def test_before_ada_the_manifests_size_settles_bf16_or_w8a16(hub, monkeypatch, manifests):
    """Before Ada a bf16 checkpoint runs in bf16 when it fits, else in w8a16: the manifest's size decides which, and
    whether even w8a16 fits, before the lookup. A start that fits goes on to the Hub."""
    on_gpu(monkeypatch, capability=(8, 6), free_gib=12)
    with pytest.raises(
        ModelError,
        match=rf"^{BIG} in w8a16 does not fit on cuda:0 \(fake GPU\): it needs about 16\.2 GiB \(1\.1 × 9\.3 GiB of "
        r"weights \+ 6 GiB of work buffers\), and 12\.0 GiB are free$",
    ):
        start(BIG)
    assert hub.requests == []
    on_gpu(monkeypatch, capability=(8, 6), free_gib=30)  # room for bf16: 1.1 × 18.6 GiB + 6 GiB
    with pytest.raises(ModelError, match=rf"^the checkpoint {BIG} at revision {REVISION} is not in any cache root "):
        start(BIG)
    assert f"GET /api/models/{BIG}/tree/{REVISION}?recursive=true&expand=false" in hub.requests


def test_a_manifest_start_that_passes_the_checks_downloads_its_pinned_revision(hub, monkeypatch, manifests):
    on_gpu(monkeypatch)
    write_table(
        {"format": 1, "model": PINNED, "revision": REVISION, "scheme": "fp8s", "scales": {}},
        store_path(PINNED, REVISION),
    )
    resolved, checkpoint, scheme = start(PINNED)
    assert (scheme, checkpoint.weights, checkpoint.revision) == ("fp8s", "downloaded", REVISION)
    assert f"GET /{PINNED}/resolve/{REVISION}/model.safetensors" in hub.requests


# -- a Hub repo outside the catalog: its format and size come with its files ---------------------------------------


def test_a_hub_repo_with_fp8_before_compute_capability_8_9(hub, monkeypatch):
    on_gpu(monkeypatch, capability=(8, 6))
    with pytest.raises(ConfigError, match=r"^quant 'fp8' needs compute capability 8\.9 or later; cuda:0 "):
        start(REPO, quant="fp8")
    assert hub.requests == []


def test_a_hub_repo_in_a_gpu_scheme_on_the_cpu(hub):
    with pytest.raises(ConfigError, match=rf"^quant 'bf16' cannot run {REPO} on cpu: allowed are fp32$"):
        start(REPO, device="cpu", quant="bf16")
    assert hub.requests == []


def test_a_hub_repo_on_a_gpu_that_is_not_there(hub, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"^device cuda:3 does not exist: 1 CUDA device\(s\) visible, cuda:0 to "):
        start(REPO, device="cuda:3")
    assert hub.requests == []


def test_a_hub_repo_that_passes_the_checks_is_downloaded_from_the_fake_hub(hub, tiny_files):
    resolved, checkpoint, scheme = start(REPO, device="cpu")
    assert (scheme, checkpoint.weights, checkpoint.revision, checkpoint.family) == (
        "fp32",
        "downloaded",
        REVISION,
        "gemma4",
    )
    for name in tiny_files:
        assert f"GET /{REPO}/resolve/{REVISION}/{name}" in hub.requests
    assert (checkpoint.folder / "model.safetensors").read_bytes() == tiny_files["model.safetensors"]


def test_the_tiny_model_is_generated_not_fetched(hub, tmp_path):
    resolved, checkpoint, scheme = start("tiny", device="cpu", cache_dirs=[str(tmp_path / "cache")])
    assert (scheme, checkpoint.weights, checkpoint.revision) == ("fp32", "generated", TINY_REVISION)
    assert hub.requests == []


# -- spinf-serve serve -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--device", "cpu"], f"spinf/gemma-4-12b-fp8 {GPU_ONLY}"),
        (["qwen3.8-27b-s", "--device", "cpu"], f"spinf/qwen3.8-27b-int4 {GPU_ONLY}"),
        ([REPO, "--device", "cpu", "--quant", "bf16"], f"quant 'bf16' cannot run {REPO} on cpu: allowed are fp32"),
    ],
)
def test_serve_refuses_in_one_line_and_the_hub_sees_nothing(tmp_path, args, reason):
    """The real command, with huggingface_hub's telemetry left on: not even its agent registry is fetched."""
    with FakeHub({REPO: REVISION}) as hub:
        done = run_serve(tmp_path, hub.url, *args)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"spinf-serve: {reason}") and done.stderr.count("\n") == 1, done.stderr
    assert hub.requests == []
