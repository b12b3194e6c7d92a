"""torch's private oneDNN ops, which the packed and int8 kernels call: looked up defensively, by name, on first use
(not at import), so that a torch without them, or a CPU that is not x86 (where they were never measured), leaves
hfbert fp32 and plain instead of failing."""

from __future__ import annotations

import functools
from typing import Any

import torch

from hfbert.platform.cpu import X86


@functools.cache
def onednn_ops(namespace: str, *names: str) -> tuple[Any, ...] | None:
    """`torch.ops.<namespace>.<name>` for each name; None off x86, or where this torch lacks any of them."""
    if not X86:
        return None
    ops = tuple(getattr(getattr(torch.ops, namespace), name, None) for name in names)
    return None if any(op is None for op in ops) else ops
