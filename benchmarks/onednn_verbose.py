"""Which oneDNN kernels a call ran: the implementation names oneDNN's verbose mode prints for each product.

    >>> onednn_kernels(lambda: None)  # doctest: +SKIP
    {}

A benchmark's table says whether AMX ran by these names (`brg_matmul:avx10_1_512_amx` is oneDNN's AMX kernel;
`..._512` without `_amx` its AVX-512 one, `jit:avx2` the AVX2 one), not by what the CPU's flags allow: oneDNN picks
its kernel per shape and data type, and an `ONEDNN_MAX_CPU_ISA` cap or a missing flag moves it down. oneDNN writes
its verbose lines to the process's stdout from C, so they are read from file descriptor 1 while the call runs.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable

import torch

# oneDNN's primitives that compute a linear layer's product (int8 runs as matmul, fp32/bf16 as inner_product).
PRODUCTS = ("matmul", "inner_product")


def onednn_kernels(call: Callable[[], object]) -> dict[str, int]:
    """How many times `call` ran each oneDNN implementation of a product, by name: {} where it ran none (MKL's
    sgemm, or a torch without oneDNN)."""
    if not torch.backends.mkldnn.is_available():
        return {}
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile() as capture:
        sys.stdout.flush()
        libc.fflush(None)
        saved = os.dup(1)
        os.dup2(capture.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                call()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        capture.seek(0)
        lines = capture.read().decode(errors="replace").splitlines()
    return dict(Counter(_implementation(line) for line in lines if _implementation(line)))


def _implementation(line: str) -> str | None:
    """The implementation name of an executed product on one verbose line ("onednn_verbose,...,exec,cpu,<kind>,
    <implementation>,..."), else None."""
    fields = line.split(",")
    if not fields[0].endswith("_verbose") or "exec" not in fields:
        return None
    at = fields.index("exec")
    kind, implementation = fields[at + 2 : at + 4] if len(fields) > at + 3 else (None, None)
    return implementation if kind in PRODUCTS else None


def describe(kernels: dict[str, int]) -> str:
    """`onednn_kernels`' answer as a note: "brg_matmul:avx10_1_512_amx x48"; or that no oneDNN product ran."""
    if not kernels:
        return "no oneDNN product ran"
    return ", ".join(f"{name} x{count}" for name, count in sorted(kernels.items(), key=lambda item: -item[1]))
