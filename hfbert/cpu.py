"""Which instruction set the CPU kernels run on: every accuracy and speed number hfbert prints names it.

torch's vectorised ops, MKL (sgemm, behind `F.linear`) and oneDNN each pick the widest instruction set the CPU
has, and each can be capped by its own environment variable (read when the library first runs):
`ATEN_CPU_CAPABILITY`, `MKL_ENABLE_INSTRUCTIONS` and `ONEDNN_MAX_CPU_ISA`. Capping them in a subprocess is how
one machine tests the kernels an older CPU would run (benchmarks/numerical_contract.py, tests/test_linear.py).

    >>> from hfbert.cpu import instruction_set
    >>> instruction_set()  # doctest: +SKIP
    'AVX512 (avx512_bf16)'
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


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
