"""The measured kernel choices kept on disk (`hfbert/inference/kernel_cache.py`, issue 64, first hour 4): a second
process reuses what the first measured instead of spending seconds before its first text; a changed machine, torch
or cap measures again; the file is written atomically with the umask's permissions; a corrupt or foreign file is
ignored with one warning, never executed, never a crash; `HFBERT_KERNEL_CACHE=off` turns it off.

Every test writes under its own temporary `HFBERT_CACHE` (conftest.py points the whole session at a temporary
folder too: no test writes to ~/.cache). Candidates here are counted, not timed: what is checked is whether a
measurement ran, and what choice came back.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import hfbert
import hfbert.inference.kernel_cache as kernel_cache
import hfbert.inference.measured as measured

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh cache folder, the cache on, and nothing measured or said yet in this process."""
    monkeypatch.setenv("HFBERT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HFBERT_KERNEL_CACHE", raising=False)
    monkeypatch.setattr(measured, "_measured", {})
    monkeypatch.setattr(kernel_cache._Said, "measuring", False)
    monkeypatch.setattr(kernel_cache._Said, "warned", set())
    # Not timed: the last candidate "wins" every row count, so that a choice read back is known exactly.
    monkeypatch.setattr(measured, "_fastest", lambda calls, rounds: len(calls) - 1)
    return tmp_path / "cache" / "kernels"


class Counted:
    """Candidates that count the calls they build (a measurement builds one per row count)."""

    def __init__(self, count: int = 2) -> None:
        self.built = 0
        self.candidates = [self._build] * count

    def _build(self, rows):
        self.built += 1
        return lambda: None


def measure(key=("cache test", 384, torch.float32), counted: Counted | None = None) -> tuple[tuple[int, ...], int]:
    """`measured_choice` as a new process would call it (this process's memory emptied first): the choice, and how
    many candidate calls were built (0: read from disk)."""
    measured._measured.clear()
    counted = counted or Counted()
    return measured.measured_choice(key, counted.candidates), counted.built


def files(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.exists() else []


def test_a_later_process_reads_the_choice_instead_of_measuring(cache):
    choice, built = measure()
    assert built == 2 * len(measured.ROW_BUCKETS)
    [path] = files(cache)
    assert path == kernel_cache.cache_file()
    again, built = measure()
    assert (again, built) == (choice, 0)


def test_a_second_python_process_reuses_the_choices_on_disk(cache):
    """In a real second process (the HTTP server's workers, Ray actors): nothing measured, the same choice."""
    choice, _ = measure(("cross-process", 1))
    script = (
        "import hfbert.inference.measured as m\n"
        "built = []\n"
        "candidate = lambda rows: built.append(rows) or (lambda: None)\n"
        "print(m.measured_choice(('cross-process', 1), [candidate, candidate]), len(built))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[0] == f"{choice} 0"


def test_a_changed_torch_cpu_or_cap_measures_again(cache, monkeypatch):
    assert measure() == ((1, 1, 1), 6)
    version = torch.__version__
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert measure()[1] > 0
    monkeypatch.setattr(torch, "__version__", version)
    assert measure()[1] == 0  # the first file again
    monkeypatch.setattr(kernel_cache, "cpu_identity", lambda: {"name": "another CPU"})
    assert measure()[1] > 0
    monkeypatch.setattr(kernel_cache, "cpu_identity", hfbert.platform.cpu.cpu_identity)
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    assert measure()[1] > 0
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    assert measure()[1] > 0
    assert len(files(cache)) == 5  # one file per machine key: none overwrote another


def test_the_file_gets_the_umasks_permissions_and_no_temporary_file_stays(cache):
    old = os.umask(0o027)
    try:
        measure()
    finally:
        os.umask(old)
    [path] = files(cache)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE(cache.stat().st_mode) == 0o750


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b'{"choices": {',  # cut short
        b"\xff\xfe not utf-8",
        b"__import__('os').system('touch pwned')",  # never executed: it is not JSON
        b"[1, 2, 3]",
        b"[" * 100_000,  # nested past Python's recursion limit
        b'{"format": "hfbert kernel choices 1", "choices": {}, "machine": {"cpu": "someone else"}}',
    ],
    ids=["empty", "truncated", "not utf-8", "python", "a list", "too deep", "another machine"],
)
def test_a_corrupt_or_foreign_file_is_ignored_with_one_warning_and_replaced(cache, content, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = kernel_cache.cache_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.warns(RuntimeWarning, match=r"kernel cache .* is ignored: ") as caught:
        choice, built = measure()
        assert built > 0
        measure(("another shape",))  # the same file again: no second warning
    assert len([warning for warning in caught if "kernel cache" in str(warning.message)]) == 1
    assert "\n" not in str(caught[0].message)
    assert not (tmp_path / "pwned").exists()
    written = json.loads(path.read_text())  # measured again and written over it: a file of this format now
    assert written["format"] == kernel_cache.FORMAT and len(written["choices"]) == 2
    assert measure()[1] == 0


@pytest.mark.parametrize("stored", [[0, 5, 0], [0, 1], ["0", 0, 0], [0, -1, 0], "000"])
def test_a_choice_out_of_range_is_measured_again(cache, stored):
    """An entry that cannot be a choice among this block's candidates (an edited file): warned, measured again."""
    choice, _ = measure()
    path = kernel_cache.cache_file()
    content = json.loads(path.read_text())
    [name] = content["choices"]
    content["choices"][name] = stored
    path.write_text(json.dumps(content))
    with pytest.warns(RuntimeWarning, match="is not 3 choices among 2 kernels"):
        again, built = measure()
    assert built > 0 and again == choice


def test_an_unwritable_folder_warns_once_and_still_measures(cache, monkeypatch):
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder should be")
    with pytest.warns(RuntimeWarning, match="cannot be written") as caught:
        assert measure()[1] > 0
        assert measure(("another shape",))[1] > 0
    assert len(caught) == 1


def test_off_reads_and_writes_nothing(cache, monkeypatch):
    monkeypatch.setenv("HFBERT_KERNEL_CACHE", "off")
    assert measure()[1] > 0
    assert measure()[1] > 0
    assert not cache.exists()


def test_the_folder_is_hfbert_cache_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HFBERT_CACHE", str(tmp_path / "mine"))
    assert kernel_cache.cache_dir() == tmp_path / "mine" / "kernels"
    monkeypatch.delenv("HFBERT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.cache_dir() == tmp_path / "xdg" / "hfbert" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kernel_cache.cache_dir() == tmp_path / "home" / ".cache" / "hfbert" / "kernels"


def test_the_first_measurement_says_so_once_naming_the_file(cache, caplog):
    with caplog.at_level(logging.WARNING, logger="hfbert"):
        measure()
        measure(("another shape",))
        measure()
    said = [record.getMessage() for record in caplog.records if "measuring" in record.getMessage()]
    assert len(said) == 1 and str(kernel_cache.cache_file()) in said[0] and "\n" not in said[0]


def test_nothing_is_said_when_everything_is_cached(cache, caplog):
    measure()
    kernel_cache._Said.measuring = False  # a new process
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hfbert"):
        assert measure()[1] == 0
    assert not caplog.records


def test_a_key_without_a_stable_name_is_measured_in_each_process(cache):
    """A key holding a lambda (its name differs per process) is not written: no other process could read it."""
    key = ("intermediate", 384, 1536, lambda x: x)
    assert measure(key)[1] > 0
    assert not cache.exists()


def test_writers_at_once_never_leave_a_file_a_reader_cannot_read(cache):
    """Threads adding entries while others read: every read finds a whole file of this format; an entry lost to a
    concurrent rename is only measured again."""
    threads = torch.get_num_threads()
    kernel_cache.store(json.dumps("seed"), [0, 0, 0], threads)
    failures = []

    def write(worker: int) -> None:
        for index in range(15):
            kernel_cache.store(json.dumps([worker, index]), [0, 1, 0], threads)

    def read() -> None:
        for _ in range(60):
            path = kernel_cache.cache_file(threads)
            if kernel_cache._read(path, kernel_cache.machine(threads), warn=False) is None:
                failures.append("unreadable")

    workers = [threading.Thread(target=write, args=(worker,)) for worker in range(4)]
    workers += [threading.Thread(target=read) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures
    assert [path.name for path in files(cache)] == [kernel_cache.cache_file(threads).name]  # no temporary file left


def test_without_a_home_folder_the_choices_are_measured_not_cached(cache, monkeypatch):
    """A service user with no home folder and none of the variables set: no crash, nothing written."""
    monkeypatch.delenv("HFBERT_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert measure()[1] > 0
    assert measure()[1] > 0
