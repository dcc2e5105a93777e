"""Tests of the hardware checks before loading and of the automatic quant choice (api spec §9.8), with the device
facts passed in or torch's CUDA queries replaced: no GPU is needed."""

from __future__ import annotations

import pytest
import torch

from spinf.catalog import resolve_model
from spinf.engine.hardware import (
    GIB,
    GPU_WORK_BYTES,
    DeviceFacts,
    check_hardware,
    check_requested,
    choose_quant,
    device_facts,
    parse_device,
    resident_bytes,
    settled_quant,
)
from spinf.errors import ConfigError, ModelError

from ..catalog.hub import QWEN_CONFIG, write_checkpoint

ADA = (8, 9)
AMPERE = (8, 0)
HOPPER = (9, 0)


def gpu(capability=HOPPER, free_gib=100.0, name="fake GPU") -> DeviceFacts:
    return DeviceFacts(device="cuda:0", name=name, capability=capability, free_bytes=int(free_gib * GIB))


@pytest.fixture
def gemma():
    return resolve_model("spinf/gemma-4-12b-fp8")


@pytest.fixture
def qwen():
    return resolve_model("qwen3.8-27b-s")


@pytest.fixture
def tiny():
    return resolve_model("tiny")


@pytest.fixture
def local_gemma(tmp_path):
    return resolve_model(str(write_checkpoint(tmp_path / "gemma-ft")))


# -- devices ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "parsed"), [("cpu", ("cpu", None)), ("cuda", ("cuda", 0)), ("cuda:3", ("cuda", 3))]
)
def test_parse_device(device, parsed):
    assert parse_device(device) == parsed


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cpu:0", "CUDA:0", "mps", ""])
def test_a_malformed_device_is_refused(device):
    with pytest.raises(ConfigError, match=rf"^device {device!r} is not cpu, cuda or cuda:N$"):
        parse_device(device)


def test_device_facts_of_the_cpu():
    facts = device_facts("cpu")
    assert (facts.device, facts.capability) == ("cpu", None)
    assert facts.free_bytes is None or facts.free_bytes > 0


def test_no_gpu_names_the_tiny_model(monkeypatch, gemma):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(
        ModelError, match=r"^device cuda:0: no CUDA GPU is visible\. .*spinf-serve serve spinf/tiny-gemma4"
    ):
        check_hardware(gemma, "fp8s", "cuda:0", 13 * GIB)


def test_a_cuda_device_that_does_not_exist(monkeypatch, gemma):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ConfigError, match=r"^device cuda:2 does not exist: 2 CUDA device\(s\) visible, cuda:0 to cuda:1$"
    ):
        check_hardware(gemma, "fp8s", "cuda:2", 13 * GIB)


def test_device_facts_of_a_gpu_come_from_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (40 * GIB + index, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"GPU {index}")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    assert device_facts("cuda:1") == DeviceFacts("cuda:1", "GPU 1", (9, 0), 40 * GIB + 1)


def test_a_catalog_gpu_model_on_cpu_names_the_tiny_model(gemma):
    with pytest.raises(
        ModelError, match=r"^spinf/gemma-4-12b-fp8 needs a CUDA GPU\. .*spinf-serve serve spinf/tiny-gemma4"
    ):
        check_hardware(gemma, "fp32", "cpu", 13 * GIB)


def test_the_tiny_model_runs_on_cpu(tiny):
    facts = DeviceFacts("cpu", "cpu", None, 8 * GIB)
    assert check_hardware(tiny, "fp32", "cpu", 4_000_000, facts=facts) is facts


def test_the_cpu_emulates_the_gemma_schemes_for_the_tiny_model_and_a_local_folder_only(tiny, local_gemma):
    facts = DeviceFacts("cpu", "cpu", None, 64 * GIB)
    for resolved in (tiny, local_gemma):
        for scheme in ("fp32", "bf16", "fp8s", "fp8", "fp8row", "w8a16", "w8a8"):
            assert check_hardware(resolved, scheme, "cpu", GIB, facts=facts) is facts
    hub = resolve_model("acme/gemma-ft")  # a Hub repo outside the catalog: fp32 only on the CPU
    with pytest.raises(ConfigError, match=r"^quant 'bf16' cannot run acme/gemma-ft on cpu: allowed are fp32$"):
        check_hardware(hub, "bf16", "cpu", GIB, weight_format="safetensors-bf16", facts=facts)
    check_hardware(hub, "fp32", "cpu", GIB, weight_format="safetensors-bf16", facts=facts)


# -- schemes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("quant", ["fp8s", "fp8", "fp8row"])
def test_fp8_schemes_need_capability_8_9(gemma, quant):
    with pytest.raises(ConfigError, match=rf"^quant '{quant}' needs compute capability 8.9 or later; .* has 8.0\. "):
        check_hardware(gemma, quant, "cuda:0", 13 * GIB, facts=gpu(AMPERE))
    check_hardware(gemma, quant, "cuda:0", 13 * GIB, facts=gpu(ADA))


@pytest.mark.parametrize("quant", ["w8a16", "w8a8", "bf16"])
def test_other_gemma_schemes_run_before_ada(gemma, quant):
    check_hardware(gemma, quant, "cuda:0", 13 * GIB, facts=gpu(AMPERE))


@pytest.mark.parametrize("quant", ["i8", "int4-i8", "f16", "int4-bf16", "int4-fp8"])
def test_int4_checkpoints_accept_their_modes(qwen, quant):
    check_hardware(qwen, quant, "cuda:0", 13 * GIB, facts=gpu(ADA))


@pytest.mark.parametrize("quant", ["w8a16", "int4-w8a8", "fp8s", "fp32"])
def test_int4_checkpoints_refuse_other_schemes(qwen, quant):
    with pytest.raises(
        ConfigError, match=rf"^quant '{quant}' cannot run spinf/qwen3.8-27b-int4 .*: allowed are i8, f16"
    ):
        check_hardware(qwen, quant, "cuda:0", 13 * GIB, facts=gpu(ADA))


def test_int4_fp8_mode_needs_ada(qwen):
    with pytest.raises(ConfigError, match=r"^quant 'int4-fp8' needs compute capability 8.9"):
        check_hardware(qwen, "int4-fp8", "cuda:0", 13 * GIB, facts=gpu(AMPERE))


def test_a_gemma_catalog_model_refuses_an_int4_mode(gemma):
    with pytest.raises(ConfigError, match=r"^quant 'i8' cannot run spinf/gemma-4-12b-fp8"):
        check_hardware(gemma, "i8", "cuda:0", 13 * GIB, facts=gpu())


# -- memory -------------------------------------------------------------------------------------------------------


def test_weights_must_fit_with_the_margin(gemma):
    weights = 12 * GIB  # fp8-static: fp8 keeps the size
    needed = int(1.1 * weights) + GPU_WORK_BYTES
    check_hardware(gemma, "fp8s", "cuda:0", weights, facts=gpu(free_gib=needed / GIB))
    with pytest.raises(
        ModelError,
        match=r"^spinf/gemma-4-12b-fp8 in fp8s does not fit on cuda:0 \(fake GPU\): it needs about 19.2 GiB "
        r"\(1.1 × 12.0 GiB of weights \+ 6 GiB of work buffers\), and 19.2 GiB are free$",
    ):
        check_hardware(gemma, "fp8s", "cuda:0", weights, facts=gpu(free_gib=(needed - 1) / GIB))


def test_bf16_of_an_fp8_checkpoint_needs_twice_the_weights(gemma):
    facts = gpu(AMPERE, free_gib=25)
    check_hardware(gemma, "w8a16", "cuda:0", 12 * GIB, facts=facts)
    with pytest.raises(ModelError, match=r"1.1 × 24.0 GiB of weights"):
        check_hardware(gemma, "bf16", "cuda:0", 12 * GIB, facts=facts)


def test_unknown_free_memory_is_not_checked(gemma):
    check_hardware(gemma, "fp8s", "cuda:0", 10_000 * GIB, facts=DeviceFacts("cuda:0", "gpu", HOPPER, None))


@pytest.mark.parametrize(
    ("weight_format", "scheme", "ratio"),
    [
        ("safetensors-bf16", "bf16", 1.0),
        ("safetensors-bf16", "fp8", 0.5),
        ("safetensors-bf16", "w8a16", 0.5),
        ("fp8-static", "bf16", 2.0),
        ("fp8-static", "fp8s", 1.0),
        ("safetensors-f32", "fp32", 1.0),
        ("safetensors-f32", "bf16", 0.5),
        ("gptq-int4-g32", "bf16", 1.0),
        ("gptq-int4-g32", "i8", 1.0),
    ],
)
def test_resident_bytes(weight_format, scheme, ratio):
    assert resident_bytes(8 * GIB, weight_format, scheme) == int(8 * GIB * ratio)


# -- the automatic choice -----------------------------------------------------------------------------------------


def test_requested_scheme_is_kept(gemma, qwen):
    assert choose_quant(gemma, "w8a8", HOPPER) == "w8a8"
    assert choose_quant(qwen, "f16", HOPPER) == "int4-f16"
    assert choose_quant(qwen, "int4-bf16", HOPPER) == "int4-bf16"


def test_catalog_fp8_checkpoint_gets_fp8s_from_ada(gemma):
    assert choose_quant(gemma, "", ADA) == "fp8s"
    assert choose_quant(gemma, "", HOPPER) == "fp8s"


def test_before_ada_bf16_if_it_fits_else_w8a16(gemma):
    # The fp8-static 12B holds 12 GiB on disk and 24 GiB in bf16: 1.1 × 24 + 6 = 32.4 GiB.
    assert choose_quant(gemma, "", AMPERE, checkpoint_bytes=12 * GIB, free_bytes=33 * GIB) == "bf16"
    assert choose_quant(gemma, "", AMPERE, checkpoint_bytes=12 * GIB, free_bytes=32 * GIB) == "w8a16"


def test_outside_the_catalog_never_fp8s(local_gemma, tmp_path):
    assert choose_quant(local_gemma, "", HOPPER) == "fp8"
    assert choose_quant(local_gemma, "", HOPPER, has_scale_table=True) == "fp8"
    repo = resolve_model("acme/gemma-ft")
    assert choose_quant(repo, "", ADA, weight_format="fp8-static", has_scale_table=True) == "fp8"


def test_a_bf16_catalog_checkpoint_gets_fp8s_only_with_a_scale_table(tmp_path):
    from spinf.catalog import load_catalog

    (tmp_path / "bf16.toml").write_text(
        'id = "acme/bf16"\nname = "bf16"\nfamily = "gemma4"\n[source]\nrepo = "acme/bf16"\n'
        'revision = "0123456789abcdef0123456789abcdef01234567"\nformat = "safetensors-bf16"\n'
    )
    resolved = resolve_model("acme/bf16", catalog=load_catalog([tmp_path]))
    assert choose_quant(resolved, "", ADA) == "fp8"
    assert choose_quant(resolved, "", ADA, has_scale_table=True) == "fp8s"
    assert choose_quant(resolved, "", AMPERE, checkpoint_bytes=20 * GIB, free_bytes=80 * GIB) == "bf16"


def test_a_manifest_default_that_is_not_auto_is_used(tmp_path):
    from spinf.catalog import load_catalog

    (tmp_path / "pinned.toml").write_text(
        'id = "acme/w8"\nname = "w8"\nfamily = "gemma4"\n[source]\nrepo = "acme/w8"\n'
        'revision = "0123456789abcdef0123456789abcdef01234567"\nformat = "safetensors-bf16"\n'
        '[quant]\ndefault = "w8a16"\nallowed = ["w8a16", "bf16"]\n'
    )
    assert choose_quant(resolve_model("acme/w8", catalog=load_catalog([tmp_path])), "", HOPPER) == "w8a16"


def test_int4_defaults_to_i8(qwen):
    assert choose_quant(qwen, "", HOPPER) == "int4-i8"
    assert choose_quant(qwen, "", AMPERE) == "int4-i8"
    decider = resolve_model("spinf/pplx-decider-v1-27b-int4")
    assert choose_quant(decider, "", ADA) == "int4-i8"


def test_int4_outside_the_catalog_by_its_config(tmp_path):
    config = {**QWEN_CONFIG, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}}
    resolved = resolve_model(str(write_checkpoint(tmp_path / "qwen-gptq", config=config)))
    assert resolved.weight_format == "gptq-int4-g32"
    assert choose_quant(resolved, "", HOPPER) == "int4-i8"


def test_fp32_on_cpu_and_for_the_tiny_model(tiny, local_gemma):
    assert choose_quant(tiny, "", None) == "fp32"
    assert choose_quant(tiny, "", HOPPER) == "fp32"
    assert choose_quant(local_gemma, "", None) == "fp32"


def test_the_auto_choice_passes_the_checks(gemma, qwen, tiny):
    for resolved, facts in [(gemma, gpu(ADA)), (qwen, gpu(AMPERE)), (tiny, gpu(HOPPER))]:
        quant = choose_quant(resolved, "", facts.capability)
        check_hardware(resolved, quant, "cuda:0", 10 * GIB, facts=facts)


# -- before the lookup ----------------------------------------------------------------------------------------------


def test_the_choice_is_settled_when_nothing_the_lookup_brings_can_change_it(gemma, qwen, tiny):
    settled = {"has_scale_table": False, "checkpoint_bytes": 13 * GIB, "free_bytes": 80 * GIB}
    assert settled_quant(gemma, "", HOPPER, **settled) == "fp8s"  # fp8-static: fp8s with or without a table
    assert settled_quant(gemma, "", AMPERE, **settled) == "bf16"
    assert settled_quant(gemma, "", AMPERE, **{**settled, "free_bytes": 30 * GIB}) == "w8a16"
    assert settled_quant(gemma, "w8a8", HOPPER, **settled) == "w8a8"
    assert settled_quant(qwen, "f16", HOPPER, **settled) == "int4-f16"
    assert settled_quant(tiny, "", HOPPER, **settled) == "fp32"
    assert settled_quant(resolve_model("acme/gemma-ft"), "", None, **settled) == "fp32"  # the CPU runs fp32 only


def test_the_choice_waits_for_what_the_lookup_brings(tmp_path):
    from spinf.catalog import load_catalog

    (tmp_path / "bf16.toml").write_text(
        'id = "acme/bf16"\nname = "bf16"\nfamily = "gemma4"\n[source]\nrepo = "acme/bf16"\n'
        'revision = "0123456789abcdef0123456789abcdef01234567"\nformat = "safetensors-bf16"\n'
    )
    bf16 = resolve_model("acme/bf16", catalog=load_catalog([tmp_path]))
    unknown = {"has_scale_table": False, "checkpoint_bytes": None, "free_bytes": 80 * GIB}
    # a table shipped in the checkpoint would make the automatic fp8 fp8s; the store's settles it
    assert settled_quant(bf16, "", HOPPER, **unknown) is None
    assert settled_quant(bf16, "", HOPPER, **{**unknown, "has_scale_table": True}) == "fp8s"
    # before Ada, bf16 or w8a16 by a size that only the files give here
    assert settled_quant(bf16, "", AMPERE, **unknown) is None
    assert settled_quant(bf16, "", AMPERE, **{**unknown, "checkpoint_bytes": 20 * GIB}) == "bf16"
    # a Hub repo's format (int4 or not) comes with its config.json
    repo = resolve_model("acme/gemma-ft")
    assert settled_quant(repo, "bf16", HOPPER, **unknown) is None
    assert settled_quant(repo, "", HOPPER, **unknown) is None


def test_a_request_for_a_repo_of_unknown_format_is_checked_as_far_as_any_format_goes():
    repo = resolve_model("acme/gemma-ft")
    cpu = DeviceFacts("cpu", "cpu", None, 64 * GIB)
    with pytest.raises(ConfigError, match=r"^quant 'bf16' cannot run acme/gemma-ft on cpu: allowed are fp32$"):
        check_requested(repo, "bf16", "cpu", cpu)
    check_requested(repo, "fp32", "cpu", cpu)
    for quant in ("fp8", "int4-fp8", "fp8s"):
        with pytest.raises(ConfigError, match=rf"^quant '{quant}' needs compute capability 8\.9 or later; "):
            check_requested(repo, quant, "cuda:0", gpu(AMPERE))
    for quant in ("bf16", "i8", "int4-f16", "w8a16", ""):  # some format runs each of them
        check_requested(repo, quant, "cuda:0", gpu(AMPERE))
    with pytest.raises(ConfigError, match=r"^quant 'fp32' cannot run acme/gemma-ft on cuda:0: allowed are fp8s, "):
        check_requested(repo, "fp32", "cuda:0", gpu())


def test_no_size_no_memory_check(gemma):
    check_hardware(gemma, "bf16", "cuda:0", None, facts=gpu(AMPERE, free_gib=1))
    with pytest.raises(ModelError, match=r"^spinf/gemma-4-12b-fp8 needs a CUDA GPU\. "):
        check_requested(gemma, "", "cpu", DeviceFacts("cpu", "cpu", None, 64 * GIB))
