"""MKL's fast branch on AMD CPUs: `MKL_CBWR=AUTO`, set at `import hfbert` where the user set nothing.

torch's x86 wheels link Intel's MKL statically, and fp32 `F.linear` (every linear layer of the plain model, and of
transformers) and float64 products (the parity reference) are MKL's sgemm and dgemm. MKL picks its code by CPU
vendor: on AMD CPUs its default can be a slower generic branch. `MKL_CBWR`, MKL's documented "conditional
numerical reproducibility" setting, makes it dispatch on the instruction set instead; on AMD CPUs the MKL in torch
2.13's wheel runs every branch named there (AVX2, AVX512, ...) as AUTO (MKL_VERBOSE prints `CNR:AUTO`), and
COMPATIBLE is slower still. So hfbert sets AUTO: the instruction set's own branch, whatever the CPU has. Summation
order is MKL's fixed order for that branch; the error against float64 stays transformers' own
(tests/test_mkl_branch.py).

Where it pays is measured per instruction set on an idle machine (`python -m benchmarks.mkl_branch`, two worker
processes taking turns; docs/cpu-inference.md): on an AVX2 Zen 3 it made the products at batch 1 much faster (issue
35), and on an AVX-512 Zen 5 too (bert-base's forward at 1x16 in 0.74x the time, every product shape faster), with
outputs within transformers' error. So hfbert sets it on every AMD CPU.

MKL reads the variable once, at its first call in the process: torch's import does not call it, a product does.
`use_fast_branch()` (which `import hfbert` runs before anything computes) sets it where

- the CPU's vendor is AMD (elsewhere MKL's own dispatch is already its fast branch),
- the user set neither `MKL_CBWR` nor `MKL_ENABLE_INSTRUCTIONS` (a user's choice is never changed),
- `HFBERT_MKL_BRANCH` is not `off` (the user's off switch),

then makes MKL read it at once and puts the environment back as it was: the branch holds for this process, and
child processes start from the user's own environment. Where MKL has already run (torch computed a product before
`import hfbert`), the branch cannot change any more: `mkl_branch()` says so, `warn_if_too_late()` warns, and the
way out is to set `MKL_CBWR=AUTO` in the environment before Python starts.

    >>> from hfbert.platform.mkl import mkl_branch
    >>> mkl_branch()  # doctest: +SKIP
    'MKL_CBWR=AUTO (set by hfbert: AMD CPU)'
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

SETTING = "MKL_CBWR"
FAST_BRANCH = "AUTO"
SWITCH = "HFBERT_MKL_BRANCH"  # "off": leave MKL's branch alone
USER_SETTINGS = (SETTING, "MKL_ENABLE_INSTRUCTIONS")
# mkl_cbwr_get's answers (mkl_service.h); MKL_CBWR_STRICT is a flag on top.
BRANCHES = {
    1: "MKL default",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    11: "AVX512_MIC",
    12: "AVX512",
    13: "AVX512_MIC_E1",
    14: "AVX512_E1",
}
STRICT = 0x10000


@dataclass
class BranchState:
    """What this process knows of MKL's branch: one value, set by `use_fast_branch` at `import hfbert`."""

    reason: str | None = None  # why MKL runs the branch it runs (None: use_fast_branch has not run)
    warned: bool = False  # warn_if_too_late has warned


STATE = BranchState()


def cpu_vendor() -> str:
    """The CPU's vendor string ("AuthenticAMD", "GenuineIntel"), or "" where it cannot be read."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("vendor_id"):
                return line.partition(":")[2].strip()
    return next((word for word in ("AuthenticAMD", "GenuineIntel") if word in platform.processor()), "")


@functools.cache
def _cbwr_get():
    """MKL's own answer to which branch it runs, or None where this torch cannot be asked: `mkl_serv_cbwr_get`, the
    service behind MKL's public `mkl_cbwr_get` (which torch's libtorch_cpu does not export; this it does). Calling
    it makes MKL read `MKL_CBWR` if it has not yet."""
    if not torch.backends.mkl.is_available():
        return None
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        function = ctypes.CDLL(str(library)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    function.restype, function.argtypes = ctypes.c_int, [ctypes.c_int]
    return function


def use_fast_branch() -> None:
    """Switch MKL to its instruction-set branch (`MKL_CBWR=AUTO`) on AMD CPUs, unless the user
    set MKL's branch or instructions, or `HFBERT_MKL_BRANCH=off`, or MKL has already run. Runs once per process.
    Where it sets nothing it asks MKL nothing either: asking would fix MKL's setting, and a user may still set it
    after `import hfbert`, before the first product."""
    if STATE.reason is not None:
        return
    user = [name for name in USER_SETTINGS if os.environ.get(name)]
    if not torch.backends.mkl.is_available():
        STATE.reason = "no MKL in this torch build"
    elif os.environ.get(SWITCH, "").strip().lower() == "off":
        STATE.reason = f"{SWITCH}=off"
    elif user:
        STATE.reason = f"{', '.join(f'{name}={os.environ[name]}' for name in user)} set in the environment"
    elif cpu_vendor() != "AuthenticAMD":
        STATE.reason = f"{cpu_vendor() or 'unknown'} CPU: MKL's own dispatch"
    else:
        get = _cbwr_get()
        os.environ[SETTING] = FAST_BRANCH
        if get is None:  # MKL cannot be asked: the variable stays, for MKL's first call to read
            STATE.reason = "set by hfbert: AMD CPU; whether MKL had already run is unknown"
            return
        try:
            took = get(1) & ~STRICT != 1  # MKL_CBWR_BRANCH_OFF: MKL had read its setting before
        finally:
            del os.environ[SETTING]
        STATE.reason = "set by hfbert: AMD CPU" if took else _late()


def _late() -> str:
    return (
        f"MKL had already run in this process before `import hfbert` could set {SETTING}={FAST_BRANCH}; "
        f"set it in the environment before Python starts: export {SETTING}={FAST_BRANCH}"
    )


def mkl_branch() -> str:
    """The branch MKL's products run in this process and why, for reports: "MKL_CBWR=AUTO (set by hfbert: AMD
    CPU)", "MKL default (GenuineIntel CPU: MKL's own dispatch)", "MKL default (HFBERT_MKL_BRANCH=off)", ... Asking
    makes MKL read its setting, as its first product would."""
    get = _cbwr_get()
    if get is None:
        if not torch.backends.mkl.is_available():
            return "no MKL in this torch build"
        running = f"{SETTING}={os.environ[SETTING]}" if os.environ.get(SETTING) else "MKL default"
    else:
        answer = get(1)
        name = BRANCHES.get(answer & ~STRICT, f"branch {answer & ~STRICT}") + (",STRICT" if answer & STRICT else "")
        running = name if answer == 1 else f"{SETTING}={name}"
    return f"{running} ({STATE.reason or 'hfbert did not set it'})"


def started_too_late() -> bool:
    """Whether hfbert wanted MKL's fast branch here but MKL had already run: what `optimize_for_inference` and the
    reports warn about."""
    return STATE.reason is not None and STATE.reason.startswith("MKL had already run")


def warn_if_too_late(stacklevel: int = 2) -> None:
    """Warn once per process where hfbert wanted MKL's fast branch but MKL had already run (`started_too_late`),
    naming the way out; `stacklevel` counts from the caller, as in `warnings.warn`. For `optimize_for_inference`
    and the tools that time or compare models."""
    if STATE.warned or not started_too_late():
        return
    import warnings

    STATE.warned = True
    warnings.warn(f"MKL runs its slower default branch on this AMD CPU: {mkl_branch()}", RuntimeWarning, stacklevel + 1)
