"""`python -m benchmarks.cotenant` (issue 71), without engines: its options refuse bad values before a run, its
neighbour stops by itself, and its report computes slowdowns, ratios and the issue's goal from the times."""

from __future__ import annotations

import time

import pytest

from benchmarks import cotenant


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--duty", "0"], "--duty 0.0: expected a share of one core"),
        (["--variant", "spin"], "expected NAME:VAR=VALUE"),
        (["--engines", "hfbert,TensorRT"], "choose from hfbert"),
        (["--conditions", "idle,storm"], "choose from idle, busy, matmul, quota"),
    ],
)
def test_bad_options_are_refused_before_a_run(capsys, argv, message):
    with pytest.raises(SystemExit):
        cotenant.parse_args(argv)
    assert message in capsys.readouterr().err


def test_variants_and_rows():
    args = cotenant.parse_args(["--engines", "hfbert int8,ONNX Runtime", "--variant", "spin:GOMP_SPINCOUNT=10000"])
    assert cotenant.engine_specs(args) == [
        ("hfbert int8", {}),
        ("hfbert int8 (shared)", {"HFBERT_THREADS": "shared"}),
        ("hfbert int8 (spin)", {"HFBERT_THREADS": "off", "GOMP_SPINCOUNT": "10000"}),
        ("ONNX Runtime", {}),
    ]


def test_the_neighbour_stops_by_itself():
    started = time.monotonic()
    cotenant.neighbour("loop", 0.5, limit=0.05)
    assert time.monotonic() - started < 1.0


def test_report_slowdowns_ratios_and_goal():
    times = {
        "idle": {"mixed": {"hfbert": [1.0, 1.0, 1.2], "ONNX Runtime": [2.0, 2.0, 2.0], "hfbert (setting off)": [1.0]}},
        "busy": {"mixed": {"hfbert": [1.5, 1.5, 1.6], "ONNX Runtime": [2.6, 2.6, 2.6], "hfbert (setting off)": [5.0]}},
    }
    result = {
        "machine": {
            "cpu": "AMD EPYC",
            "instruction_set": "AVX512",
            "cores": 2,
            "affinity": 2,
            "measured": "2026-12-07",
            "load_before": (1.0, 1.0, 1.0),
            "load_after": (2.0, 1.5, 1.0),
        },
        "cores": {"idle": {"others": 0.1, "neighbour": 0.0}, "busy": {"others": 0.2, "neighbour": 0.49}},
        "workers": {"shown": {"hfbert": {"threads": 2, "setting": "OMP_WAIT_POLICY=PASSIVE (set by hfbert)"}}},
        "skipped": {},
        "shape": {"hidden_size": 384},
        "times": times,
    }
    text = cotenant.markdown(result)
    assert "| hfbert | 1000.0 | 1500.0 (1.50x) |" in text
    assert "| ONNX Runtime | 2000.0 [2.00] | 2600.0 (1.30x) [1.73] |" in text
    assert "| hfbert (setting off) | 1000.0 [1.00] | 5000.0 (5.00x) [3.33] |" in text
    assert "- busy, mixed: worst peer 1.30x; hfbert 1.50x MISSED" in text
