"""Which instruction set the CPU kernels run on: every accuracy and speed number hfbert prints names it.

torch's vectorised ops, MKL (sgemm, behind `F.linear`) and oneDNN each pick the widest instruction set the CPU
has, and each can be capped by its own environment variable (read when the library first runs):
`ATEN_CPU_CAPABILITY`, `MKL_ENABLE_INSTRUCTIONS` and `ONEDNN_MAX_CPU_ISA`. Capping them in a subprocess is how
one machine tests the kernels an older CPU would run (benchmarks/numerical_contract.py, tests/test_linear.py).

    >>> from hfbert.platform.cpu import instruction_set
    >>> instruction_set()  # doctest: +SKIP
    'AVX512 (avx512_bf16)'
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
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


def instruction_set() -> str:
    """The widest instruction set torch's CPU kernels use here ("AVX512", "AVX2", ...), with the native-bf16 flag
    and any cap set in the environment, e.g. "AVX512 (avx512_bf16)" or "AVX512, capped: ONEDNN_MAX_CPU_ISA=AVX2".
    """
    capability = torch.backends.cpu.get_cpu_capability()
    details = ["avx512_bf16"] if capability.startswith("AVX512") and "avx512_bf16" in cpu_flags() else []
    caps = [f"{name}={os.environ[name]}" for name in CAPS if os.environ.get(name)]
    text = capability + (f" ({', '.join(details)})" if details else "")
    return text + (f", capped: {' '.join(caps)}" if caps else "")


def bfloat16_native() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX512-BF16 or AMX) as oneDNN sees it, caps included."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if not (check and torch.backends.mkldnn.is_available() and check()):
        return False
    # oneDNN says yes on any AVX-512 CPU (it emulates bf16 on Skylake's), and under a cap below the CPU's bf16 ISA.
    flags = cpu_flags()
    if flags and not flags & {"avx512_bf16", "amx_bf16"}:
        return False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return cap in ("", "ALL", "DEFAULT") or "BF16" in cap or "AMX" in cap or cap.startswith("AVX10")


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
