"""A parity run's paths are resolved once (`resolve_paths`): the CLI checks its outputs against them and hands the
same value to `run_parity`, which then takes no second path for the same input."""

from __future__ import annotations

import shutil

import pytest

from hfbert.tools.parity import ParityPaths, resolve_paths, run_parity
from hfbert.tools.parity.engines.base import ArtifactError


def test_an_artifact_is_found_inside_the_model_and_named_as_given(tiny_mlm, tmp_path):
    model = shutil.copytree(tiny_mlm, tmp_path / "model")
    (model / "onnx").mkdir()
    (model / "onnx" / "model.onnx").touch()
    paths = resolve_paths(model, artifacts=["onnx/model.onnx"])
    assert paths == ParityPaths(
        model=str(model),
        directory=model,
        artifacts=(model / "onnx" / "model.onnx",),
        artifact_names=("onnx/model.onnx",),
    )
    assert paths.reference_directory == model
    with pytest.raises(ArtifactError, match="missing.onnx: no such file or folder"):
        resolve_paths(model, artifacts=["missing.onnx"])


@pytest.mark.parametrize("given", [{"artifacts": ["model.onnx"]}, {"reference": "."}, {"revision": "main"}])
def test_resolved_paths_take_no_second_path(tiny_mlm, given):
    with pytest.raises(ValueError, match=f"{next(iter(given))}: given with paths already resolved"):
        run_parity(resolve_paths(tiny_mlm), progress=False, **given)
