"""Every environment cap on the kernels' instruction set, in every spelling its library reads (issue 64, item 7):
`hfbert.platform.cpu.ENVIRONMENT_CAPS` is the one list, and everything that depends on a cap reads it there.

oneDNN reads `ONEDNN_MAX_CPU_ISA`, then its older `DNNL_MAX_CPU_ISA` (torch's ideep copies `MKLDNN_MAX_CPU_ISA` over
the latter first); the reading is checked against oneDNN's own answer in subprocesses (slow), the rest in-process.
The bf16 mode under each spelling: tests/test_bf16.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import hfbert.inference.measured as measured
from hfbert.platform.cpu import (
    CAPS,
    ENVIRONMENT_CAPS,
    bfloat16_native,
    cpu_flags,
    instruction_set,
    onednn_cap,
)

ONEDNN_SPELLINGS = ("ONEDNN_MAX_CPU_ISA", "MKLDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# Each: the environment, the spelling and value oneDNN obeys (None: uncapped).
PRECEDENCE = [
    ({"DNNL_MAX_CPU_ISA": "AVX512_CORE"}, ("DNNL_MAX_CPU_ISA", "AVX512_CORE")),
    ({"MKLDNN_MAX_CPU_ISA": "avx512_core"}, ("MKLDNN_MAX_CPU_ISA", "avx512_core")),
    ({"ONEDNN_MAX_CPU_ISA": "ALL", "DNNL_MAX_CPU_ISA": "AVX512_CORE"}, ("ONEDNN_MAX_CPU_ISA", "ALL")),
    ({"MKLDNN_MAX_CPU_ISA": "AVX512_CORE", "DNNL_MAX_CPU_ISA": "ALL"}, ("MKLDNN_MAX_CPU_ISA", "AVX512_CORE")),
    ({"ONEDNN_MAX_CPU_ISA": "", "DNNL_MAX_CPU_ISA": "AVX512_CORE"}, ("DNNL_MAX_CPU_ISA", "AVX512_CORE")),
]
native_bf16_cpu = pytest.mark.skipif(
    not cpu_flags() & {"avx512_bf16", "amx_bf16"}, reason="this CPU has no native bf16 for a cap to take away"
)


@pytest.fixture
def uncapped(monkeypatch):
    """The test's environment without any cap: each test sets its own."""
    for name in CAPS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_one_list_holds_every_spelling_of_every_cap():
    assert set(ONEDNN_SPELLINGS) <= set(CAPS)
    assert {"ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR"} <= set(CAPS)
    onednn = next(cap for cap in ENVIRONMENT_CAPS if cap.library == "oneDNN")
    assert onednn.names == ONEDNN_SPELLINGS  # oneDNN's order: the first one set wins


@pytest.mark.parametrize(("environment", "obeyed"), PRECEDENCE)
def test_the_onednn_cap_is_read_in_onednns_order(uncapped, environment, obeyed):
    for name, value in environment.items():
        uncapped.setenv(name, value)
    assert onednn_cap() == obeyed[1].upper()
    capped = obeyed[1].upper() != "ALL"
    assert (f"capped: {'='.join(obeyed)}" in instruction_set()) == capped
    if cpu_flags() & {"avx512_bf16", "amx_bf16"}:
        assert bfloat16_native() == (not capped)


@native_bf16_cpu
@pytest.mark.parametrize("name", ONEDNN_SPELLINGS)
def test_bf16_is_emulated_under_a_cap_below_it_in_any_spelling(uncapped, name):
    uncapped.setenv(name, "AVX512_CORE_VNNI")
    assert not bfloat16_native()
    uncapped.setenv(name, "AVX512_CORE_BF16")
    assert bfloat16_native()


def test_each_spelling_of_each_cap_is_a_measured_choice_of_its_own(uncapped, monkeypatch):
    """A process that caps a library (in any spelling) between two models measures again: the kernels differ."""
    monkeypatch.setattr(measured, "_measured", {})
    monkeypatch.setenv("HFBERT_KERNEL_CACHE", "off")
    calls = []

    def counted(rows):
        calls.append(rows)
        return lambda: None

    measured.measured_choice(("caps", "key"), [counted, counted])
    for name in CAPS:
        before = len(calls)
        uncapped.setenv(name, "AVX2")
        measured.measured_choice(("caps", "key"), [counted, counted])
        assert len(calls) > before, name
        uncapped.delenv(name)


ONEDNN_ISA = """
import torch
from hfbert.platform.cpu import bfloat16_native
reorder = torch.ops.mkldnn._reorder_linear_weight
packed = reorder(torch.randn(64, 64).bfloat16())
torch.ops.mkldnn._linear_pointwise(torch.randn(8, 64).bfloat16(), packed, None, "none", [], "")
print("hfbert-native", bfloat16_native())
"""


@pytest.mark.slow  # a fresh process per environment: oneDNN reads its cap once
@native_bf16_cpu
@pytest.mark.parametrize(("environment", "obeyed"), PRECEDENCE)
def test_onednn_itself_obeys_the_spelling_hfbert_reads(environment, obeyed):
    """oneDNN's own verbose line names the instruction set it dispatches to: bf16's where hfbert says native."""
    env = {key: value for key, value in os.environ.items() if key not in CAPS}
    env.update(environment, ONEDNN_VERBOSE="1")
    result = subprocess.run([sys.executable, "-c", ONEDNN_ISA], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    isa = next(line for line in result.stdout.splitlines() if ",info,cpu,isa:" in line)
    native = result.stdout.split("hfbert-native ")[1].split()[0] == "True"
    assert native == ("bfloat16" in isa), (isa, native)
    assert native == (obeyed[1].upper() == "ALL")
