"""MKL's Intel branch on any x86 CPU, for the tests whose numbers depend on it.

torch's wheel links MKL, which picks its sgemm code by CPU vendor: on Intel CPUs a branch that AMD CPUs never run,
whatever `MKL_CBWR` says (its products round differently from the AUTO branch hfbert sets on AMD). Two tests once
passed on AMD and failed on a Xeon for that reason alone (issue 49). MKL asks `mkl_serv_intel_cpu_true()`; a
library that answers yes, put first by `LD_PRELOAD` (as huggingface/text-embeddings-inference's Dockerfile does),
makes an AMD CPU run Intel's branch, so a machine of either vendor can check both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import hfbert.platform.mkl as mkl

SOURCE = "int mkl_serv_intel_cpu_true(void) { return 1; }\n"


def intel_branch_environment(directory: Path) -> dict[str, str]:
    """The environment for a child process that runs MKL's Intel branch: this process's own on an Intel CPU;
    elsewhere, MKL's vendor check answered yes by a library built here with the C compiler (skips without one).
    hfbert's own branch setting is switched off, as it is on Intel CPUs."""
    environment = {**os.environ, mkl.SWITCH: "off"}
    for name in mkl.USER_SETTINGS:
        environment.pop(name, None)
    if mkl.cpu_vendor() == "GenuineIntel":
        return environment
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the library that answers MKL's Intel check on this non-Intel CPU")
    (directory / "intel.c").write_text(SOURCE)
    library = directory / "libmkl_intel_branch.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(directory / "intel.c")], check=True)
    environment["LD_PRELOAD"] = " ".join(filter(None, [str(library), environment.get("LD_PRELOAD", "")]))
    return environment
