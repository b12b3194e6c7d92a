"""Optional dependencies of the tools, imported where needed, each with one error that says how to install it."""

from __future__ import annotations

import importlib
from typing import Any

INSTALL_PARITY = "pip install 'hfbert[parity]'"


class MissingExtraError(ImportError):
    """An optional dependency (transformers, matplotlib, numpy) is not installed; the message says how to get it."""


def import_optional(module: str, missing: str) -> Any:
    """`module`, imported; `MissingExtraError(missing)` (the message says how to install it) when it is not there."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(missing) from None


def import_transformers() -> Any:
    return import_optional(
        "transformers", f"the parity check compares against transformers, which is not installed: {INSTALL_PARITY}"
    )


def import_pyplot() -> Any:
    import_optional("matplotlib", "--plot needs matplotlib: pip install matplotlib (or 'hfbert[plot]')").use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def import_numpy() -> Any:
    return import_optional("numpy", "writing .npy needs numpy: pip install numpy (or write .jsonl)")
