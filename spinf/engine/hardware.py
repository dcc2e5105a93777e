"""Hardware checks before loading, and the automatic quant choice (api spec §9.8, engine spec B.8).

`check_hardware` answers, before a byte of weights is read, whether the resolved model can run on the chosen
device with the chosen scheme: the device exists, the scheme is one the checkpoint accepts and the GPU can run, and
the weights fit in the free memory with a margin. `choose_quant` makes the automatic choice of §9.8. Both run twice
on a start: before the checkpoint's lookup, on what the manifest and the settings say (`settled_quant`: the choice
when the lookup cannot change it; `check_requested` for a repo whose format only its files tell), so that a refused
start downloads nothing, and after it on the files themselves. The device facts come from `device_facts` (torch);
tests pass `DeviceFacts` in instead.

Schemes by name: the Gemma schemes of B.8 (``fp8s fp8 fp8row w8a16 w8a8 bf16``), the int4 modes of B.14.3
(``i8 f16 fp8 bf16``, reported as ``int4-<mode>``), and ``fp32``: the weights as they are, the CPU's scheme and the
built-in tiny model's automatic one. The CPU runs the Gemma schemes too, emulated, for the tiny model and a local
folder only (`CPU_SCHEMES`).
"""

from __future__ import annotations

import re

import attrs
import torch

from spinf.catalog.manifest import FORMAT_SCHEMES, FP8_SCHEMES, GEMMA_SCHEMES, INT4_MODES
from spinf.catalog.resolve import ResolvedModel
from spinf.errors import ConfigError, ModelError

GIB = 1 << 30
# Room for the weights: a loaded model holds a little more than its tensors (engine spec B.8: "1.1 × the
# checkpoint + 6 GiB" for bf16), plus work buffers on top: LM-head temporaries alone are about 3 GiB (B.17).
WEIGHTS_MARGIN = 1.1
GPU_WORK_BYTES = 6 * GIB
CPU_WORK_BYTES = 1 * GIB
FP8_MIN_CAPABILITY = (8, 9)
# The GPTQ v1 int4 format, named as api spec §9.5's manifests name it: every group size goes by this name (the
# loader reads the real one from config.json and the start-up log says it); it is never shown as a description.
INT4_FORMAT = "gptq-int4-g32"
INT4_PREFIX = "int4-"  # an int4 checkpoint's scheme is its mode with this prefix (api spec §9.8)
DEFAULT_FORMAT = "safetensors-bf16"
TINY_HINT = "spinf-serve serve spinf/tiny-gemma4 --device cpu"

# Bytes per weight in each checkpoint format and as each scheme holds it on the device; int4 checkpoints stay
# packed whatever the mode (B.14.3), so their size on the device is their size on disk.
FORMAT_BYTES = {"safetensors-bf16": 2.0, "fp8-static": 1.0, "safetensors-f32": 4.0}
SCHEME_BYTES = {"fp8s": 1.0, "fp8": 1.0, "fp8row": 1.0, "w8a16": 1.0, "w8a8": 1.0, "bf16": 2.0, "fp32": 4.0}

# What a checkpoint outside the catalog may run on a GPU before its config.json tells its format.
ANY_FORMAT_SCHEMES = tuple(dict.fromkeys(scheme for schemes in FORMAT_SCHEMES.values() for scheme in schemes))

# What the CPU runs for the tiny model and a local folder: fp32, and the Gemma schemes emulated (tests, trials).
CPU_SCHEMES = ("fp32", *GEMMA_SCHEMES)

_DEVICE_PATTERN = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


@attrs.frozen
class DeviceFacts:
    """What the checks need to know about a device. ``capability`` is None on CPU; ``free_bytes`` None if unknown."""

    device: str
    name: str
    capability: tuple[int, int] | None
    free_bytes: int | None


def parse_device(device: str) -> tuple[str, int | None]:
    """``("cpu", None)`` or ``("cuda", index)`` (``cuda`` alone is ``cuda:0``); `ConfigError` for anything else."""
    match = _DEVICE_PATTERN.match(device)
    if match is None or (match[1] == "cpu" and match[2] is not None):
        raise ConfigError(f"device {device!r} is not cpu, cuda or cuda:N")
    if match[1] == "cpu":
        return "cpu", None
    return "cuda", int(match[2] or 0)


def device_facts(device: str) -> DeviceFacts:
    """The facts of ``device`` from torch; `ModelError` with no GPU, `ConfigError` for a GPU index that is absent."""
    kind, index = parse_device(device)
    if kind == "cpu":
        return DeviceFacts(device="cpu", name="cpu", capability=None, free_bytes=_host_available_bytes())
    count = torch.cuda.device_count()
    if count == 0:
        raise ModelError(f"device {device}: no CUDA GPU is visible. To try the API without a GPU: {TINY_HINT}")
    if index >= count:
        raise ConfigError(
            f"device {device} does not exist: {count} CUDA device(s) visible, cuda:0 to cuda:{count - 1}"
        )
    free_bytes, _ = torch.cuda.mem_get_info(index)
    return DeviceFacts(
        device=f"cuda:{index}",
        name=torch.cuda.get_device_name(index),
        capability=tuple(torch.cuda.get_device_capability(index)),
        free_bytes=free_bytes,
    )


def _host_available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo, or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def check_hardware(
    resolved: ResolvedModel,
    quant: str,
    device: str,
    weights_bytes: int | None,
    *,
    weight_format: str | None = None,
    facts: DeviceFacts | None = None,
) -> DeviceFacts:
    """Refuses a start that cannot work on ``device``; returns the device facts it checked against.

    ``quant`` is the scheme to run (as `choose_quant` gives it; an int4 mode with or without ``int4-``),
    ``weights_bytes`` the size of the checkpoint's safetensors files (None before the lookup when no manifest gives
    it: the memory is then not checked), ``weight_format`` the checkpoint format when the resolution did not know it
    (a Hub repo), ``facts`` the device facts (default: `device_facts`). Raises `ModelError` when the model cannot
    run on this machine (a GPU model without a GPU, too little memory) and `ConfigError` when a setting is wrong
    for it (the device, the scheme).
    """
    kind, _ = parse_device(device)
    _check_gpu_model(resolved, kind)
    facts = device_facts(device) if facts is None else facts
    weight_format = weight_format or resolved.weight_format or DEFAULT_FORMAT
    scheme = quant.removeprefix(INT4_PREFIX) if weight_format == INT4_FORMAT else quant
    _check_scheme(resolved, quant, scheme, allowed_schemes(resolved, weight_format, on_cpu=kind == "cpu"), facts)
    if weights_bytes is None:
        return facts
    resident = resident_bytes(weights_bytes, weight_format, scheme)
    work = CPU_WORK_BYTES if kind == "cpu" else GPU_WORK_BYTES
    needed = fit_bytes(resident, work)
    if facts.free_bytes is not None and needed > facts.free_bytes:
        raise ModelError(
            f"{resolved.served_name} in {quant} does not fit on {facts.device} ({facts.name}): it needs about "
            f"{needed / GIB:.1f} GiB ({WEIGHTS_MARGIN} × {resident / GIB:.1f} GiB of weights + {work / GIB:.0f} GiB "
            f"of work buffers), and {facts.free_bytes / GIB:.1f} GiB are free"
        )
    return facts


def check_requested(resolved: ResolvedModel, quant: str, device: str, facts: DeviceFacts) -> None:
    """Before the lookup, when the scheme is not settled yet (`settled_quant` gave None): refuses a catalog GPU model
    on the CPU, and a requested ``quant`` that no checkpoint format could run on ``facts``' device: any but ``fp32``
    on the CPU, an fp8 scheme (an int4 checkpoint's fp8 mode too) before compute capability 8.9, a name that is no
    format's scheme. What the format decides waits for `check_hardware` after the lookup."""
    kind, _ = parse_device(device)
    _check_gpu_model(resolved, kind)
    if quant:
        allowed = allowed_schemes(resolved, resolved.weight_format, on_cpu=kind == "cpu")
        _check_scheme(resolved, quant, quant.removeprefix(INT4_PREFIX), allowed, facts)


def _check_gpu_model(resolved: ResolvedModel, kind: str) -> None:
    if kind == "cpu" and resolved.manifest is not None and not resolved.is_builtin:
        raise ModelError(f"{resolved.served_name} needs a CUDA GPU. To try the API without a GPU: {TINY_HINT}")


def _check_scheme(
    resolved: ResolvedModel, quant: str, scheme: str, allowed: tuple[str, ...], facts: DeviceFacts
) -> None:
    """``scheme`` (``quant`` without an int4 checkpoint's ``int4-``) must be ``allowed``, and an fp8 one needs Ada."""
    if scheme not in allowed:
        raise ConfigError(
            f"quant {quant!r} cannot run {resolved.served_name} on {facts.device}: allowed are {', '.join(allowed)}"
        )
    on_gpu = facts.device != "cpu"  # the CPU emulates the fp8 products (`allowed_schemes` says for which models)
    if scheme in FP8_SCHEMES and on_gpu and (facts.capability is None or facts.capability < FP8_MIN_CAPABILITY):
        capability = ".".join(map(str, facts.capability)) if facts.capability else "none"
        raise ConfigError(
            f"quant {quant!r} needs compute capability 8.9 or later; {facts.device} ({facts.name}) has {capability}. "
            f"Choose another scheme with --quant ({', '.join(s for s in allowed if s not in FP8_SCHEMES)})"
        )


def allowed_schemes(resolved: ResolvedModel, weight_format: str | None, *, on_cpu: bool) -> tuple[str, ...]:
    """The schemes that may run ``resolved``: ``fp32`` on CPU (and there, for the built-in tiny model and a local
    folder, every Gemma scheme, emulated: `spinf.engine.schemes`), else the manifest's, else its format's; with the
    format not known yet (None), those of any format."""
    if on_cpu:
        if not (resolved.is_builtin or resolved.local_folder is not None):
            return ("fp32",)
        # an int4 folder runs its modes, emulated (`spinf.engine.qwen35.int4`); with the format not known yet, any
        if weight_format == INT4_FORMAT:
            return INT4_MODES
        return CPU_SCHEMES + (INT4_MODES if weight_format is None else ())
    if resolved.manifest is not None:
        return resolved.manifest.quant_allowed
    if weight_format is None:
        return ANY_FORMAT_SCHEMES
    return FORMAT_SCHEMES.get(weight_format, GEMMA_SCHEMES)


def resident_bytes(checkpoint_bytes: int, weight_format: str, scheme: str) -> int:
    """About how many bytes the weights take on the device under ``scheme``, from the checkpoint's size."""
    if weight_format == INT4_FORMAT:
        return checkpoint_bytes
    return int(checkpoint_bytes * SCHEME_BYTES[scheme] / FORMAT_BYTES[weight_format])


def fit_bytes(resident: int, work: int) -> int:
    """The free memory needed to load ``resident`` bytes of weights and run: the margin plus work buffers."""
    return int(WEIGHTS_MARGIN * resident) + work


def choose_quant(
    resolved: ResolvedModel,
    requested: str,
    capability: tuple[int, int] | None,
    *,
    weight_format: str | None = None,
    has_scale_table: bool = False,
    checkpoint_bytes: int = 0,
    free_bytes: int | None = None,
    family: str | None = None,
) -> str:
    """The scheme to run (§9.8): ``requested`` when given (else the manifest's non-auto default), else automatic.

    ``capability`` is the GPU's compute capability (None on CPU), ``has_scale_table`` whether an fp8s scale table
    exists for this checkpoint revision, ``checkpoint_bytes`` and ``free_bytes`` decide whether bf16 fits (unknown
    free memory counts as fitting). Automatic: ``fp32`` on CPU and for the built-in tiny model; ``int4-i8`` for an
    int4 checkpoint; ``fp8`` from capability 8.9, upgraded to ``fp8s`` for a catalog checkpoint that is fp8-static
    or has a scale table (never outside the catalog); otherwise ``bf16`` if it fits, else ``w8a16``. Int4 modes
    come back as ``int4-<mode>``. ``family``: the checkpoint's stack, when known; a float Qwen3.5 checkpoint runs
    ``fp32`` on the CPU and ``bf16`` on a GPU.
    """
    weight_format = weight_format or resolved.weight_format or DEFAULT_FORMAT
    manifest = resolved.manifest
    if not requested and manifest is not None and manifest.quant_default != "auto":
        requested = manifest.quant_default
    if requested:
        mode = requested.removeprefix(INT4_PREFIX)
        return f"{INT4_PREFIX}{mode}" if weight_format == INT4_FORMAT and mode in INT4_MODES else requested
    if weight_format == INT4_FORMAT:
        return f"{INT4_PREFIX}i8"  # the CPU emulates it (a local folder only: a catalog int4 model needs a GPU)
    if family == "qwen35":  # a float Qwen3.5 checkpoint runs as it is (its stack runs none of the Gemma schemes)
        return "fp32" if capability is None else "bf16"
    if capability is None and weight_format == "fp8-static":
        return "fp8s"  # its own fp8 weights and input scales, emulated (the folder is served as it is, fp32 or not)
    if capability is None or resolved.is_builtin:
        return "fp32"
    if capability >= FP8_MIN_CAPABILITY:
        return "fp8s" if manifest is not None and (weight_format == "fp8-static" or has_scale_table) else "fp8"
    bf16_bytes = resident_bytes(checkpoint_bytes, weight_format, "bf16")
    if free_bytes is None or fit_bytes(bf16_bytes, GPU_WORK_BYTES) <= free_bytes:
        return "bf16"
    return "w8a16"


def settled_quant(
    resolved: ResolvedModel,
    requested: str,
    capability: tuple[int, int] | None,
    *,
    has_scale_table: bool,
    checkpoint_bytes: int | None,
    free_bytes: int | None,
) -> str | None:
    """`choose_quant`'s answer before the checkpoint's lookup, or None when what the lookup brings could change it.

    The lookup brings three things: the format of a repo outside the catalog (a request may become an int4 mode,
    the automatic choice ``int4-i8``), a scale table shipped in the checkpoint (the automatic ``fp8`` of a catalog
    checkpoint becomes ``fp8s``) and the size when the manifest gives none (``bf16`` or ``w8a16`` before Ada).
    ``has_scale_table`` says whether the table store holds one, ``checkpoint_bytes`` is the manifest's size.
    """
    if resolved.weight_format is None and (requested or capability is not None):
        return None
    scheme = choose_quant(
        resolved,
        requested,
        capability,
        has_scale_table=has_scale_table,
        checkpoint_bytes=checkpoint_bytes or 0,
        free_bytes=free_bytes,
    )
    manifest = resolved.manifest
    if requested or (manifest is not None and manifest.quant_default != "auto"):
        return scheme
    if scheme == "fp8" and manifest is not None:
        return None
    if scheme == "bf16" and checkpoint_bytes is None and free_bytes is not None:
        return None
    return scheme
