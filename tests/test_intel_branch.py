"""The tests whose numbers depend on MKL's vendor branch, rerun on MKL's Intel branch whatever this CPU is.

On a 2-core Xeon the default run once failed two tests that passed on AMD CPUs (issue 49). Neither was a defect of
hfbert; MKL's Intel branch rounds transformers' own fp32 products differently, and each test took one fp32 kernel's
error for another's:
- tests/test_parity.py judged hfbert's sdpa by transformers' eager error on a 3-vector pooler; hfbert's sdpa error
  equals transformers' sdpa error bit for bit, and transformers' two kernels differ by 0.70-1.52x from seed to seed
  there. Each kernel is now judged by transformers' error on either kernel.
- tests/test_parity_gate.py judged an exact ONNX export of "[CLS] [SEP]" at 1.5x; on 2-4 token sequences ONNX
  Runtime's products measure 1.3-1.9x MKL's error (1.44-1.5x on the AMD branch: it passed by a hair). That test is
  about "untested", and now says so with its bound.
This file keeps both fixed on AMD machines too, in a child process that runs Intel's branch
(tests/support/mkl_intel.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import hfbert.platform.mkl as mkl

from support.mkl_intel import intel_branch_environment

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = "import torch; g = torch.Generator().manual_seed(0); a, b = torch.randn(37, 384, generator=g), torch.randn(1536, 384, generator=g); print(torch.nn.functional.linear(a, b).sum(-1).tolist())"  # noqa: E501
BRANCH_DEPENDENT = [
    "tests/test_parity.py::test_small_configs_every_activation",
    "tests/test_parity_gate.py::test_texts_that_cannot_hold_padding_leave_the_verdict_untested",
]


@pytest.mark.slow
@pytest.mark.skipif(mkl._cbwr_get() is None, reason="this torch links no MKL whose branch could be chosen")
def test_branch_dependent_tests_pass_on_mkls_intel_branch(tmp_path):
    environment = intel_branch_environment(tmp_path)
    if mkl.cpu_vendor() != "GenuineIntel":

        def product(env: dict[str, str]) -> str:
            return subprocess.run(
                [sys.executable, "-c", PRODUCT], env=env, capture_output=True, text=True, check=True
            ).stdout

        plain = {key: value for key, value in environment.items() if key != "LD_PRELOAD"}
        if product(environment) == product(plain):
            pytest.skip("MKL's vendor check could not be answered on this CPU: its Intel branch is not reachable here")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *BRANCH_DEPENDENT]
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
