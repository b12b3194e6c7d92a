"""The engines of a parity run, one file each, behind one interface (base.py): load, then run a batch to named
outputs. hfbert (each mode) and transformers are `TorchEngine`s; every module here with `accepts(path)` and
`load(path, hidden_size, threads, precision)` is a deployment engine, found by `open_artifact` from the path
alone: adding an engine means adding one file. The deployment packages are imported only when an artifact of
theirs is loaded."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from hfbert.tools.parity.engines.base import ArtifactEngine, ArtifactError, TorchEngine

__all__ = ["ArtifactEngine", "ArtifactError", "TorchEngine", "artifact_engines", "open_artifact"]


def artifact_engines() -> list[object]:
    """The modules of this package that load artifacts, in name order."""
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]
    return [module for module in modules if hasattr(module, "accepts") and hasattr(module, "load")]


def open_artifact(path: Path, hidden_size: int, threads: int, precision: str = "f32") -> ArtifactEngine:
    """The artifact at `path`, loaded by the engine its path names: a `.onnx` file (ONNX Runtime), an OpenVINO
    `.xml`, a CTranslate2 folder. One ArtifactError naming the path when no engine takes it."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{path}: no such file or folder")
    for module in artifact_engines():
        if module.accepts(path):
            return module.load(path, hidden_size, threads, precision)
    raise ArtifactError(
        f"{path}: not an artifact this check runs (expected a .onnx file, an OpenVINO .xml or a CTranslate2 "
        f"model folder with model.bin)"
    )
