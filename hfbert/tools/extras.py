"""Optional dependencies of the tools, imported where needed, each with one error that says how to install it."""

from __future__ import annotations

from typing import Any

INSTALL_PARITY = "pip install 'hfbert[parity]'"


class MissingExtraError(ImportError):
    """An optional dependency (transformers, matplotlib, numpy) is not installed; the message says how to get it."""


def import_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise MissingExtraError(
            f"the parity check compares against transformers, which is not installed: {INSTALL_PARITY}"
        ) from None
    return transformers


def import_pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError("--plot needs matplotlib: pip install matplotlib (or 'hfbert[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def import_numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise MissingExtraError("writing .npy needs numpy: pip install numpy (or write .jsonl)") from None
    return numpy
