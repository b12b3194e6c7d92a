"""MKL's fast branch on AMD CPUs (`hfbert/platform/mkl.py`): `import hfbert` sets `MKL_CBWR=AUTO` where it pays,
never over a user's own setting, not with `HFBERT_MKL_BRANCH=off`, not on other vendors, and says so where MKL had
already run. Either way the model stays as accurate as transformers against float64: each setting in a fresh
process (MKL reads it once per process), outputs compared element-wise with transformers fp32 and by RMS error with
transformers float64. Speed is measured by `python -m benchmarks.mkl_branch`, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hfbert.platform.mkl as mkl

ROOT = Path(__file__).resolve().parents[1]
has_mkl = pytest.mark.skipif(mkl._cbwr_get() is None, reason="this torch links no MKL that can be asked its branch")

# In a fresh process: `force` pretends to be an AMD CPU without AVX-512 (where hfbert sets the branch) before
# asking again, then hfbert and transformers run the same inputs; prints what ran and the errors.
WORKER = r"""
import json, os, sys
import torch
import hfbert
import hfbert.platform.mkl as mkl
from support.helpers import Accuracy, make_batches
if sys.argv[1] == "force":
    mkl.STATE.reason = None
    mkl.cpu_vendor = lambda: "AuthenticAMD"
    mkl.use_fast_branch()
import transformers
directory = sys.argv[2]
exact = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").double().eval()
theirs = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
ours = hfbert.BertModel.from_pretrained(directory).eval()
accuracy, largest = Accuracy(), 0.0
config = ours.config
for batch in make_batches(config.vocab_size, config.type_vocab_size, config.hidden_size)[:2]:
    with torch.no_grad():
        outputs = [model(**batch.kwargs).last_hidden_state for model in (ours, theirs, exact)]
    accuracy.add(*outputs, batch.real)
    largest = max(largest, (outputs[0] - outputs[1])[batch.real].abs().max().item())
print(json.dumps({"branch": mkl.mkl_branch(), "environment": os.environ.get("MKL_CBWR"), "ours": accuracy.ours,
                  "theirs": accuracy.theirs, "passed": accuracy.passed(), "largest": largest}))
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from support.helpers import write_random_transformers_checkpoint

    directory = tmp_path_factory.mktemp("mkl-branch") / "bert"
    return write_random_transformers_checkpoint(
        directory, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024
    )


def run_worker(mode: str, checkpoint: Path, **environment: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in (*mkl.USER_SETTINGS, mkl.SWITCH)}
    env.update(environment, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    command = [sys.executable, "-c", WORKER, mode, str(checkpoint)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@has_mkl
def test_the_fast_branch_is_as_accurate_as_transformers(checkpoint):
    """Set by hfbert, MKL runs AUTO for the process (the environment put back as it was); without it, its default.
    Both within the numerical contract, both element-wise next to transformers fp32 in the same process."""
    fast = run_worker("force", checkpoint)
    default = run_worker("plain", checkpoint, HFBERT_MKL_BRANCH="off")
    assert fast["branch"] == "MKL_CBWR=AUTO (set by hfbert: AMD CPU)" and fast["environment"] is None
    assert default["branch"] == "MKL default (HFBERT_MKL_BRANCH=off)"
    for run in (fast, default):
        assert run["passed"] and 0 < run["theirs"] < 1e-4, run
        assert run["largest"] < 1e-4, run


@has_mkl
def test_a_users_own_setting_is_kept(checkpoint):
    """MKL_CBWR or MKL_ENABLE_INSTRUCTIONS in the environment: hfbert changes nothing, even where it would set it."""
    compatible = run_worker("force", checkpoint, MKL_CBWR="COMPATIBLE")
    assert compatible["environment"] == "COMPATIBLE"
    assert compatible["branch"] == "MKL_CBWR=COMPATIBLE (MKL_CBWR=COMPATIBLE set in the environment)"
    assert compatible["passed"], compatible
    capped = run_worker("force", checkpoint, MKL_ENABLE_INSTRUCTIONS="AVX2")
    assert capped["environment"] is None
    assert capped["branch"] == "MKL default (MKL_ENABLE_INSTRUCTIONS=AVX2 set in the environment)"


@has_mkl
def test_import_hfbert_runs_no_product_before_choosing_the_branch():
    """Whatever `import hfbert` loads, MKL has not read its setting yet after it (where hfbert leaves it unset: the
    off switch), so a user or a tool can still set it."""
    code = (
        "import os, hfbert, hfbert.inference, hfbert.platform.mkl as mkl\n"
        "os.environ['MKL_CBWR'] = 'AUTO'\n"
        "print(mkl._cbwr_get()(1))"
    )
    env = {key: value for key, value in os.environ.items() if key not in mkl.USER_SETTINGS}
    env[mkl.SWITCH] = "off"  # where hfbert sets the branch itself, it has asked MKL already
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout) & ~mkl.STRICT == 2


@pytest.fixture
def fresh(monkeypatch):
    """mkl.py as before `import hfbert` ran it, on a clean environment."""
    monkeypatch.setattr(mkl, "STATE", mkl.BranchState())
    for name in (*mkl.USER_SETTINGS, mkl.SWITCH):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("vendor", "reason"),
    [
        ("GenuineIntel", "GenuineIntel CPU: MKL's own dispatch"),
        ("", "unknown CPU: MKL's own dispatch"),
    ],
)
def test_other_cpus_keep_mkls_default(fresh, vendor, reason):
    fresh.setattr(mkl, "cpu_vendor", lambda: vendor)
    mkl.use_fast_branch()
    assert mkl.STATE.reason == reason and "MKL_CBWR" not in os.environ and not mkl.started_too_late()


def test_the_off_switch_and_a_users_setting_win(fresh):
    fresh.setattr(mkl, "cpu_vendor", lambda: "AuthenticAMD")
    fresh.setenv("HFBERT_MKL_BRANCH", "OFF")
    mkl.use_fast_branch()
    assert mkl.STATE.reason == "HFBERT_MKL_BRANCH=off" and "MKL_CBWR" not in os.environ
    fresh.setattr(mkl, "STATE", mkl.BranchState())
    fresh.delenv("HFBERT_MKL_BRANCH")
    fresh.setenv("MKL_CBWR", "AVX2,STRICT")
    mkl.use_fast_branch()
    assert mkl.STATE.reason == "MKL_CBWR=AVX2,STRICT set in the environment" and os.environ["MKL_CBWR"] == "AVX2,STRICT"


@has_mkl
def test_where_mkl_has_already_run_it_says_so():
    """A process where torch computed a product before hfbert could choose (here: hfbert switched off at import,
    then on): too late to choose, and said, not hidden; the warning once, pointing at its caller."""
    code = (
        "import os, warnings, torch, hfbert, hfbert.platform.mkl as mkl\n"
        "torch.nn.functional.linear(torch.randn(64, 64), torch.randn(64, 64))\n"
        "del os.environ[mkl.SWITCH]\n"
        "mkl.STATE.reason, mkl.cpu_vendor = None, lambda: 'AuthenticAMD'\n"
        "mkl.use_fast_branch()\n"
        "assert mkl.started_too_late() and 'MKL_CBWR' not in os.environ, mkl.STATE.reason\n"
        "branch = mkl.mkl_branch()\n"
        "assert branch.startswith('MKL default (MKL had already run') and 'export MKL_CBWR=AUTO' in branch, branch\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    mkl.warn_if_too_late(stacklevel=1)\n"
        "    mkl.warn_if_too_late(stacklevel=1)\n"
        "assert len(caught) == 1 and 'export MKL_CBWR=AUTO' in str(caught[0].message), caught\n"
        "assert caught[0].category is RuntimeWarning and caught[0].filename == '<string>'\n"
    )
    env = {key: value for key, value in os.environ.items() if key not in mkl.USER_SETTINGS}
    env[mkl.SWITCH] = "off"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
