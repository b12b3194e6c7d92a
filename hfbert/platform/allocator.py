"""Keep freed activation memory in the process for the next forward, as inference runtimes' own arenas do.

A CPU forward allocates and frees the same large activations at every call (bert-base, 8 x 128 tokens: 12 MB for
each feed-forward intermediate). torch takes CPU memory straight from malloc (its caching allocator is for GPUs),
and glibc's malloc gives such blocks back to the kernel when they are freed (it unmaps blocks above its mmap
threshold and trims the top of the heap above its trim threshold), so the next forward faults every page in again,
which costs a large share of a forward's time in kernel page faults. ONNX Runtime, OpenVINO and CTranslate2 keep
freed memory in their own arenas. `keep_freed_memory` raises glibc's two thresholds so that freed blocks stay in
the heap for reuse (after the first forward, no fault at all; tests/test_inference.py counts them):

    >>> from hfbert.platform.allocator import keep_freed_memory
    >>> keep_freed_memory()  # doctest: +SKIP
    True

It is process-wide, as malloc is: the process keeps up to KEPT_BYTES of freed memory (its resident memory stays at
its high-water mark instead of falling back after a large batch), and blocks above KEPT_BYTES still go straight to
the kernel. `hfbert.optimize_for_inference` calls it. It does nothing off glibc (macOS, Windows, musl) and leaves
the process alone when its owner already chose malloc's thresholds (`MALLOC_MMAP_THRESHOLD_`,
`MALLOC_TRIM_THRESHOLD_` or `glibc.malloc` in `GLIBC_TUNABLES`) or preloads another allocator (jemalloc,
tcmalloc: `LD_PRELOAD`), which keeps freed memory by itself.
"""

from __future__ import annotations

import functools
import os
import platform

KEPT_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_OWNER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD")


@functools.cache  # once per process, as the setting is
def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks up to KEPT_BYTES for reuse (see the module docstring). True where
    the thresholds are set (now or by an earlier call); False where this process's malloc is not glibc's or its
    owner already chose."""
    if platform.libc_ver()[0] != "glibc":
        return False
    if any(os.environ.get(name) for name in _OWNER_SETTINGS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return False
    # Both, in this order: setting either also stops glibc from moving the thresholds by itself.
    return bool(mallopt(_M_MMAP_THRESHOLD, KEPT_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, KEPT_BYTES))
