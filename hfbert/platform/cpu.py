"""Which instruction set the CPU kernels run on: every accuracy and speed number hfbert prints names it.

torch's vectorised ops, MKL (sgemm, behind `F.linear`) and oneDNN each pick the widest instruction set the CPU
has, and each can be capped by its own environment variables (read when the library first runs). `ENVIRONMENT_CAPS`
is the one list of them, each in every spelling its library reads, in the order it reads them: ATen's
`ATEN_CPU_CAPABILITY`; MKL's `MKL_ENABLE_INSTRUCTIONS` and `MKL_CBWR` (its branch: `mkl.py`); oneDNN's
`ONEDNN_MAX_CPU_ISA`, then `MKLDNN_MAX_CPU_ISA` (which torch's ideep copies over `DNNL_MAX_CPU_ISA`), then oneDNN's
older `DNNL_MAX_CPU_ISA`. Capping them in a subprocess is how one machine tests the kernels an older CPU would run
(benchmarks/numerical_contract.py, tests/test_linear.py). Everything that depends on a cap reads it here:
`instruction_set()`, `bfloat16_native()`, the key of the measured kernel choices (`hfbert.inference.measured`).

    >>> from hfbert.platform.cpu import instruction_set
    >>> instruction_set()  # doctest: +SKIP
    'AVX512 (avx512_bf16)'
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import NamedTuple

import torch


class Cap(NamedTuple):
    """An environment setting that caps (or picks) the instruction set one library's kernels run."""

    library: str
    names: tuple[str, ...]  # every spelling the library reads, in its order: the first one set (not empty) wins
    uncapped: tuple[str, ...] = ()  # values (case-insensitive) that leave the library's widest code in place


# oneDNN reads ONEDNN_ before DNNL_ (its getenv_string_user; an empty value counts as unset) and compares the value
# case-insensitively; torch's ideep copies MKLDNN_MAX_CPU_ISA over DNNL_MAX_CPU_ISA before oneDNN reads it. MKL
# (2024.0 in torch 2.13's wheels) and ATen read one spelling each; MKL's older MKL_DEBUG_CPU_TYPE is gone from it.
ENVIRONMENT_CAPS = (
    Cap("ATen", ("ATEN_CPU_CAPABILITY",)),  # "default" is its scalar code: a cap too
    Cap("MKL", ("MKL_ENABLE_INSTRUCTIONS",)),
    Cap("MKL's branch", ("MKL_CBWR",), ("AUTO",)),
    Cap("oneDNN", ("ONEDNN_MAX_CPU_ISA", "MKLDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"), ("ALL",)),
)
# Every spelling of every cap: what a test strips from the environment before capping a subprocess its own way.
CAPS = tuple(name for cap in ENVIRONMENT_CAPS for name in cap.names)
ONEDNN_CAP = ENVIRONMENT_CAPS[-1]
# oneDNN's ISA names below its first native-bf16 one (avx512_core_bf16). Anything else, a name it does not know
# included (which it ignores), leaves bf16 native where the CPU has it.
_BELOW_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
# Where torch's private oneDNN ops (packed fp32, int8) were measured and are used; elsewhere (ARM) F.linear.
X86 = platform.machine().lower() in ("x86_64", "amd64", "x64")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux); empty where /proc/cpuinfo does not exist."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return set()
    line = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.partition(":")[2].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def cap_setting(cap: Cap) -> tuple[str, str] | None:
    """The spelling of `cap` its library obeys in this environment and its value, e.g. ("DNNL_MAX_CPU_ISA",
    "AVX512_CORE"); None where no spelling is set."""
    return next(((name, os.environ[name]) for name in cap.names if os.environ.get(name)), None)


def environment_caps() -> dict[str, str]:
    """Every spelling of every cap set in this environment, name -> value (overridden spellings included: what
    the kernels run here depends on the whole set)."""
    return {name: os.environ[name] for name in CAPS if os.environ.get(name)}


def onednn_cap() -> str:
    """The instruction set oneDNN is capped to here, upper case as oneDNN's names are ("AVX512_CORE"), whichever
    spelling set it; "" where none is set."""
    setting = cap_setting(ONEDNN_CAP)
    return setting[1].upper() if setting else ""


def instruction_set() -> str:
    """The widest instruction set torch's CPU kernels use here ("AVX512", "AVX2", ...), with the native-bf16 flag
    and every cap in effect, in the spelling its library obeys, e.g. "AVX512 (avx512_bf16)" or "AVX512, capped:
    DNNL_MAX_CPU_ISA=AVX512_CORE".
    """
    capability = torch.backends.cpu.get_cpu_capability()
    details = ["avx512_bf16"] if capability.startswith("AVX512") and "avx512_bf16" in cpu_flags() else []
    caps = []
    for cap in ENVIRONMENT_CAPS:
        setting = cap_setting(cap)
        if setting and setting[1].split(",")[0].strip().upper() not in cap.uncapped:
            caps.append("=".join(setting))
    text = capability + (f" ({', '.join(details)})" if details else "")
    return text + (f", capped: {' '.join(caps)}" if caps else "")


@functools.cache  # the CPU does not change under a process
def cpu_identity() -> dict[str, object]:
    """What tells this CPU's kernels apart from another's: its vendor, family, model and name, and the flags of the
    instruction sets the kernels pick from (the measured kernel choices are cached under it)."""
    fields = _cpuinfo()
    prefixes = ("sse", "ssse", "avx", "amx", "fma", "f16c", "bmi")
    return {
        "vendor": fields.get("vendor_id", platform.processor()),
        "family": fields.get("cpu family", ""),
        "model": fields.get("model", ""),
        "name": cpu_name(),
        "machine": platform.machine(),
        "flags": sorted(flag for flag in cpu_flags() if flag.startswith(prefixes)),
    }


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (Linux); empty elsewhere."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.read_text(errors="replace").splitlines():
        if not line.strip():
            break
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return fields


def bfloat16_native() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX512-BF16 or AMX) as oneDNN sees it, caps included."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if not (check and torch.backends.mkldnn.is_available() and check()):
        return False
    # oneDNN says yes on any AVX-512 CPU (it emulates bf16 on Skylake's), and under a cap below the CPU's bf16 ISA,
    # in any spelling (`ENVIRONMENT_CAPS`).
    flags = cpu_flags()
    if flags and not flags & {"avx512_bf16", "amx_bf16"}:
        return False
    return onednn_cap() not in _BELOW_BF16


# Users pick bf16 to go faster; where the CPU emulates it, BERT runs several times slower than in fp32
# (docs/cpu-inference.md), so say it before they measure.
EMULATED_BFLOAT16_WARNING = (
    "bfloat16 on this CPU ({cpu}, {isa}) is emulated in software: it has no native bf16 instructions (avx512_bf16 "
    "or AMX), and BERT runs about 3-5x slower than in float32. Use float32, "
    "or hfbert.optimize_for_inference(model) (fp32, packed) or quantize='int8' for speed."
)
_warned_about_bfloat16 = False


def warn_if_emulated_bfloat16(model: torch.nn.Module, stacklevel: int = 2) -> None:
    """Warn once per process when `model` holds bf16 tensors on a CPU that emulates bf16; `stacklevel` counts
    from the caller, as in `warnings.warn`, so the warning points at the user's line."""
    global _warned_about_bfloat16
    if _warned_about_bfloat16 or bfloat16_native():
        return
    if any(p.dtype == torch.bfloat16 and p.device.type == "cpu" for p in model.parameters()):
        import warnings

        _warned_about_bfloat16 = True
        message = EMULATED_BFLOAT16_WARNING.format(cpu=cpu_name(), isa=instruction_set())
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
