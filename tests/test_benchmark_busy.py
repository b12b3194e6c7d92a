"""A benchmark result measured while other processes kept the cores busy is not published to docs/ unless forced,
and a forced one says so where it is rendered (benchmarks/busy.py, benchmarks/report.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import busy, report

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def docs(tmp_path, monkeypatch):
    """report.py writing into a copy of docs/ instead of the real one."""
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setattr(report, "DOCS", tmp_path)
    monkeypatch.setattr(report, "RESULTS", tmp_path / "results")
    shutil.copy(ROOT / "docs" / "cpu-inference.md", tmp_path)
    return tmp_path


def benchmark_result(others_cores: float) -> dict:
    result = json.loads((ROOT / "docs" / "results" / "benchmark.json").read_text())
    result["machine"]["others_cores"] = others_cores
    result["machine"].pop("busy_forced", None)
    return result


def test_a_busy_run_is_refused_and_writes_nothing(docs):
    page = (docs / "cpu-inference.md").read_text()
    with pytest.raises(SystemExit, match=r"kept 0\.45 cores busy during the run, more than the 0\.3 .*--allow-busy"):
        report.publish("benchmark", benchmark_result(0.45))
    assert not (docs / "results").exists()
    assert (docs / "cpu-inference.md").read_text() == page


def test_a_forced_busy_run_is_published_marked_as_forced(docs):
    report.publish("benchmark", benchmark_result(0.45), allow_busy=True)
    assert json.loads((docs / "results" / "benchmark.json").read_text())["machine"]["busy_forced"] is True
    rendered = report.section((docs / "cpu-inference.md").read_text(), "benchmark")
    assert "other processes kept 0.45 of 2 cores busy meanwhile, more than the 0.3" in rendered
    assert "published anyway with `--allow-busy`" in rendered


def test_a_quiet_run_is_published_without_a_note(docs):
    report.publish("benchmark", benchmark_result(0.12))
    rendered = report.section((docs / "cpu-inference.md").read_text(), "benchmark")
    assert "other processes kept 0.12 of 2 cores busy meanwhile; measured" in rendered
    assert "busy_forced" not in json.loads((docs / "results" / "benchmark.json").read_text())["machine"]


def test_a_result_rendered_from_elsewhere_follows_the_same_rule(docs, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "benchmark.json"
    elsewhere.write_text(json.dumps(benchmark_result(0.8)))
    with pytest.raises(SystemExit, match="more than the 0.3"):
        report.render_file("benchmark", elsewhere)
    assert not (docs / "results").exists()


def test_the_numerical_contract_is_judged_by_its_busiest_worker(docs):
    workers = [{"others_cores": 0.1, "cores": 2}, {"others_cores": 0.6, "cores": 2}]
    with pytest.raises(SystemExit, match="0.60 cores"):
        busy.settle(workers, allow_busy=False)
    busy.settle(workers, allow_busy=True)
    assert all(worker["busy_forced"] for worker in workers)


def test_a_busy_machine_is_refused_before_the_run(monkeypatch):
    monkeypatch.setattr(busy, "SAMPLE_SECONDS", 0)
    monkeypatch.setattr(busy, "BusyMeter", lambda: SimpleNamespace(cores=lambda: 0.9))
    with pytest.raises(SystemExit, match=r"kept 0\.90 cores busy over the last 0 s before the run"):
        busy.refuse_busy_start(update_docs=True, allow_busy=False)
    busy.refuse_busy_start(update_docs=True, allow_busy=True)
    busy.refuse_busy_start(update_docs=False, allow_busy=False)


def test_others_cores_leaves_out_this_process():
    # 10 s of wall time, the machine busy 7 CPU seconds more, 4 of them this process's own: 0.3 cores of others.
    assert busy.others_cores((100.0, 20.0), (107.0, 24.0), 10.0) == pytest.approx(0.3)
    assert busy.others_cores(None, (1.0, 1.0), 10.0) is None
