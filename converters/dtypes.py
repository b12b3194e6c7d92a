"""The dtypes hfbert stores, loads and runs, by the names its commands and config.json use."""

from __future__ import annotations

import torch

# What a user may ask a model to run in (`--dtype`, `dtype=`): the names transformers writes in config.json.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# What a stored parameter may be: BERT's kernels run these (float64 for reference runs); fp8 / fp4 storage would
# load into a model that cannot run.
PARAMETER_DTYPES = (*DTYPES.values(), torch.float64)


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16", as config.json writes it."""
    return str(dtype).removeprefix("torch.")


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A dtype, or its name as transformers takes it ("float16", "torch.bfloat16"); "auto" and None mean the
    stored dtype (None). Raises ValueError for a name that is no torch dtype."""
    if dtype is None or dtype == "auto":
        return None
    if not isinstance(dtype, str):
        return dtype
    value = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype (e.g. 'float32', 'bfloat16', or 'auto')")
    return value
