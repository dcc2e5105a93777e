"""The verdict of a parity run against a recorded reference (engine spec B.15, api spec §10): what a run's bits
depend on (`engine_platform`: the torch build, and the CPU's instruction set or the GPU), the ``reference`` name a
recorded run carries (`reference_name`), and the rule a run is judged by (`judge`: bit for bit on the platform the
reference was recorded on; elsewhere, within `CROSS_PLATFORM_BOUNDS`, or, for a scheme without a bound, bit for bit
all the same, though that is not expected there). `spinf.engine.parity` runs the fixture and reads the files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

_NAMED_PLATFORM = re.compile(r"; device (.+); torch (\S+)$")  # the end of a `reference_name`

# The largest difference of one log-prob accepted against a reference recorded on another platform, by this run's
# quant scheme. fp32 only: its values move by reordered sums alone (the vector width of the CPU kernels, the BLAS
# code path), about ten fp32 ulps of the largest values (|lp| up to about 50 on the built-in fixture, where an ulp is
# 3.8e-6). Measured on the tiny model against its AVX-512 reference: 4.1e-5 on AVX2 kernels, 3.6e-5 on the scalar
# ones. The low-precision schemes have no bound: their values depend on the GPU's kernels by far more, and none
# has been measured, so against a reference from another (or an unknown) platform they pass only bit for bit.
CROSS_PLATFORM_BOUNDS = {"fp32": 1e-4}


def reference_name(*, model: str, scheme: str, device: str, torch_version: str, lm_head: str = "fp32") -> str:
    """The ``reference`` string of a recorded run: what its bits depend on."""
    return f"{model}; quant {scheme}; lm-head {lm_head}; device {device}; torch {torch_version}"


def engine_reference_name(info: Mapping, platform: Mapping) -> str:
    """The `reference_name` of a run on an engine whose `Engine.info` is ``info``, on `engine_platform` ``platform``.

    On the CPU the device is named with the vector instruction set torch dispatches to: the bits differ between,
    say, AVX2 and AVX-512 kernels.
    """
    if platform["device"] == "cpu":
        device = f"cpu {platform['isa']}"
    else:
        device = f"{platform['gpu']} (capability {platform['capability']})"
    model = f"{info['model']}@{info['revision']}"
    return reference_name(
        model=model,
        scheme=info["quant"],
        device=device,
        torch_version=info["torch"],
        lm_head=info.get("lm_head", "fp32"),  # the head's precision as run (`Engine.info`), part of the bits
    )


def engine_platform(info: Mapping, device_type: str) -> dict[str, str | None]:
    """What the bits of a run depend on besides the model and the scheme: the torch build and, on the CPU, the
    CPU's model and the instruction set torch dispatches to, or the GPU's name, capability and CUDA version."""
    import torch

    if device_type == "cpu":
        return {
            "device": "cpu",
            "cpu": cpu_model(),
            "isa": torch.backends.cpu.get_cpu_capability(),
            "torch": info["torch"],
        }
    return {
        "device": device_type,
        "gpu": info["gpu"],
        "capability": info["capability"],
        "torch": info["torch"],
        "cuda": info["cuda"],
    }


def cpu_model() -> str:
    """The CPU's model name: Linux's ``/proc/cpuinfo``, else what the `platform` module knows."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass  # not Linux: the processor string is the best there is
    return platform.processor() or platform.machine() or "unknown"


def describe_platform(platform: Mapping) -> str:
    """A platform in words: ``cpu AVX512 (AMD EPYC), torch 2.13.0+cpu`` or ``NVIDIA H200 (capability 9.0), …``; a
    part a file records as null is "not recorded"."""
    if platform.get("device") == "cpu":
        where = f"cpu {platform.get('isa')} ({platform.get('cpu') or 'CPU model not recorded'})"
    else:
        where = f"{platform.get('gpu')} (capability {platform.get('capability')}, CUDA {platform.get('cuda')})"
    return f"{where}, torch {platform.get('torch')}"


@attrs.frozen
class Verdict:
    """How the last pass compares with a reference: whose platform, the rule applied, and the outcome in words."""

    platform: str  # "same", "different", or "unknown" (a reference that records none, taken for another platform)
    bound: float | None  # the lp_max_abs allowed; None: bit for bit (the same platform, or a scheme without a bound)
    passed: bool
    lines: tuple[str, str]  # what was compared with what, then the outcome

    def as_json(self) -> dict:
        rule = "bit for bit" if self.bound is None else "lp_max_abs <= bound"
        return {"platform": self.platform, "rule": rule, "bound": self.bound, "passed": self.passed}


def judge(last: Mapping, reference: Mapping, path: str, platform: Mapping, scheme: str) -> Verdict:
    """The verdict of a pass's ``parity`` metrics against ``reference`` (read from ``path``) for a run on
    ``platform`` in ``scheme``: bit for bit where the reference records this very platform. Elsewhere, or where it
    records none (older files, and every file the reference engine writes), bits are not expected to agree:
    ``lp_max_abs`` must be within the scheme's `CROSS_PLATFORM_BOUNDS`, and a scheme without a bound passes only
    when every value is bit-identical all the same; the failure then says how much differs."""
    theirs, here = reference.get("platform"), describe_platform(platform)
    share, worst, n = last["lp_exact_share"], last["lp_max_abs"], last["n"]
    if theirs is not None and dict(theirs) == dict(platform):
        compared = f"{path} was recorded on this platform ({here}): every log-prob must match bit for bit"
        if share == 1:
            return Verdict("same", None, True, (compared, f"passed: bit for bit over {n} cells"))
        failed = f"failed: lp_exact_share {share:.6f} < 1 on the last pass (lp_max_abs {worst:.3g} over {n} cells)"
        return Verdict("same", None, False, (compared, failed))
    if theirs is None:
        named = _NAMED_PLATFORM.search(reference.get("reference") or "")
        said = f" (an older file; its name says {named[1]}, torch {named[2]})" if named else ""
        kind, recorded = "unknown", f"records no platform{said}, so it is taken for another one"
    else:
        kind, recorded = "different", f"was recorded on {describe_platform(theirs)}"
    compared = f"{path} {recorded}; this run is on {here}: bitwise parity is not expected across platforms"
    bound = CROSS_PLATFORM_BOUNDS.get(scheme)
    if bound is None:
        return Verdict(kind, None, share == 1, (compared, _unbounded(last, scheme)))
    passed = worst <= bound  # NaN fails
    outcome = (
        f"{'passed' if passed else 'failed'}: lp_max_abs {worst:.3g} {'<=' if passed else '>'} {bound:g}, the "
        f"bound for quant {scheme} across platforms (over {n} cells; lp_exact_share {share:.6f})"
    )
    return Verdict(kind, bound, passed, (compared, outcome))


def _unbounded(last: Mapping, scheme: str) -> str:
    """The outcome across platforms for a scheme without a bound: passed when bit-identical anyway, else what
    differs."""
    n = last["n"]
    if last["lp_exact_share"] == 1:
        return f"passed: bit for bit over {n} cells, though quant {scheme} is not expected to match across platforms"
    differ = round((1 - last["lp_exact_share"]) * 2 * n)  # two log-probs per cell
    return (
        f"failed: {differ} of {2 * n} log-probs differ (lp_max_abs {last['lp_max_abs']:.3g}, lp_mean_abs "
        f"{last['lp_mean_abs']:.3g}, raw_max_abs {last['raw_max_abs']:.3g}, raw_sign_agree "
        f"{last['raw_sign_agree']:.6f}), and no bound is stated for quant {scheme} across platforms, so only bit "
        "for bit passes; record a reference on this platform with --record"
    )
