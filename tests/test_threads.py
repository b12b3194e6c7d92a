"""torch's threads on a shared CPU (`hfbert/platform/threads.py`, issue 71): `import hfbert` sets OpenMP's passive wait
policy before torch loads libgomp where `HFBERT_THREADS=shared` asks, never over a user's own setting, and puts the
environment back for child processes; torch's thread count comes down to the CPUs the process may use, its CPU
affinity or its cgroup quota (read here from fake /proc and cgroup files). What libgomp really runs is what it prints
itself (`OMP_DISPLAY_ENV=VERBOSE`), in a fresh process. Speed is measured by `python -m benchmarks.cotenant`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hfbert.platform.threads as threads

ROOT = Path(__file__).resolve().parents[1]
# libgomp's own report of the variables it read when it loaded (GOMP_SPINCOUNT: 0 for PASSIVE, 300000 by default).
PASSIVE = ("OMP_WAIT_POLICY = 'PASSIVE'", "GOMP_SPINCOUNT = '0'")
DEFAULT_SPIN = "GOMP_SPINCOUNT = '300000'"
# After `import hfbert`: the variable as this process's environment has it, and as a child process sees it.
CHILD = (
    "import os, subprocess, sys\n"
    "import hfbert\n"
    "from hfbert.platform.threads import threads_setting\n"
    "child = subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"OMP_WAIT_POLICY\"))'],\n"
    "                       capture_output=True, text=True).stdout.strip()\n"
    "print(os.environ.get('OMP_WAIT_POLICY'), child, threads_setting(), sep='|')\n"
)


@pytest.fixture
def fresh(monkeypatch):
    """threads.py as before `import hfbert` ran it, on a clean environment."""
    monkeypatch.setattr(threads, "STATE", threads.ThreadState())
    for name in (*threads.USER_WAIT_SETTINGS, *threads.USER_COUNT_SETTINGS, threads.SWITCH):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def run_python(code: str, **environment: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in (*threads.USER_WAIT_SETTINGS, threads.SWITCH)}
    env.update(environment, OMP_DISPLAY_ENV="VERBOSE")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_import_hfbert_leaves_the_wait_policy_by_default_and_says_how_to_ask():
    """Not the default: on an idle machine the passive policy was up to 1.4x slower at small shapes (one CPU family
    measured; docs/cpu-inference.md)."""
    result = run_python(CHILD)
    assert result.returncode == 0, result.stderr[-3000:]
    assert DEFAULT_SPIN in result.stderr, result.stderr
    setting = result.stdout.strip().split("|")[2]
    assert setting.startswith("libgomp's default (HFBERT_THREADS=shared or OMP_WAIT_POLICY=PASSIVE on a shared CPU); ")


def test_shared_sets_the_passive_policy_and_restores_the_environment():
    result = run_python(CHILD, HFBERT_THREADS="Shared")
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(line in result.stderr for line in PASSIVE), result.stderr
    environment, child, setting = result.stdout.strip().split("|")
    assert (environment, child) == ("None", "None")
    assert setting.startswith("OMP_WAIT_POLICY=PASSIVE (set by hfbert); ")


def test_the_off_switch_leaves_libgomps_default():
    result = run_python(CHILD, HFBERT_THREADS="Off")
    assert result.returncode == 0, result.stderr[-3000:]
    assert DEFAULT_SPIN in result.stderr, result.stderr
    assert result.stdout.strip().split("|")[2].startswith("libgomp's default (HFBERT_THREADS=off); ")


def test_rules_in_process(fresh):
    fresh.setenv("OMP_WAIT_POLICY", "active")
    threads.use_passive_wait()
    assert threads.STATE.wait == "OMP_WAIT_POLICY=active (set in the environment)"
    assert os.environ["OMP_WAIT_POLICY"] == "active"
    fresh.setattr(threads, "STATE", threads.ThreadState())
    fresh.delenv("OMP_WAIT_POLICY")
    fresh.setenv("HFBERT_THREADS", "shared")
    threads.use_passive_wait()  # torch is loaded in this process: too late, and said
    assert "too late" in threads.STATE.wait and "export OMP_WAIT_POLICY=PASSIVE" in threads.STATE.wait
    assert "OMP_WAIT_POLICY" not in os.environ


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


V2_MOUNT = "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n"
V1_MOUNT = "35 25 0:31 {root} /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct\n"


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        (  # cgroup v2, a pod limited to 1.5 CPUs under a parent without a limit
            {
                "proc/self/cgroup": "0::/kubepods/pod1/box\n",
                "proc/self/mountinfo": V2_MOUNT,
                "sys/fs/cgroup/kubepods/pod1/box/cpu.max": "max 100000\n",
                "sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000\n",
                "sys/fs/cgroup/kubepods/cpu.max": "max 100000\n",
            },
            1.5,
        ),
        (  # cgroup v2, the parent's limit is the smaller
            {
                "proc/self/cgroup": "0::/a/b\n",
                "proc/self/mountinfo": V2_MOUNT,
                "sys/fs/cgroup/a/b/cpu.max": "300000 100000\n",
                "sys/fs/cgroup/a/cpu.max": "50000 100000\n",
            },
            0.5,
        ),
        (  # cgroup v1 seen from inside a container: the mount's root is the container's own cgroup
            {
                "proc/self/cgroup": "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
                "proc/self/mountinfo": V1_MOUNT.format(root="/docker/abc"),
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            },
            2.0,
        ),
        (  # cgroup v1 without a limit
            {
                "proc/self/cgroup": "4:cpu,cpuacct:/\n",
                "proc/self/mountinfo": V1_MOUNT.format(root="/"),
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            },
            None,
        ),
        ({"proc/self/cgroup": "0::/\n"}, None),  # no mountinfo: nothing to read
    ],
)
def test_cgroup_quota_is_read_from_its_files(tmp_path, files, quota):
    assert threads.cgroup_cpu_quota(write_tree(tmp_path, files)) == quota


@pytest.fixture
def four_cores_quota_one_and_a_half(fresh, tmp_path):
    fresh.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    root = write_tree(
        tmp_path,
        {
            "proc/self/cgroup": "0::/pod\n",
            "proc/self/mountinfo": V2_MOUNT,
            "sys/fs/cgroup/pod/cpu.max": "150000 100000\n",
        },
    )
    before = torch.get_num_threads()
    yield root
    torch.set_num_threads(before)


def test_available_cpus_are_the_fewer_of_affinity_and_quota(four_cores_quota_one_and_a_half):
    assert threads.available_cpus(four_cores_quota_one_and_a_half) == (2, "cgroup CPU quota 1.5 of 4 cores")
    assert threads.available_cpus(four_cores_quota_one_and_a_half / "nothing") == (4, "4 cores in its CPU affinity")


def test_thread_count_comes_down_to_the_quota_never_up(four_cores_quota_one_and_a_half, fresh):
    root = four_cores_quota_one_and_a_half
    torch.set_num_threads(4)
    threads.use_available_cpus(root)
    assert torch.get_num_threads() == 2
    assert threads.STATE.count == "2 threads (set by hfbert, torch had 4: cgroup CPU quota 1.5 of 4 cores)"
    fresh.setattr(threads, "STATE", threads.ThreadState())
    torch.set_num_threads(1)  # below the CPUs available: the user's, kept
    threads.use_available_cpus(root)
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize(("name", "value"), [("OMP_NUM_THREADS", "4"), ("HFBERT_THREADS", "off")])
def test_thread_count_left_alone_where_the_user_said(four_cores_quota_one_and_a_half, fresh, name, value):
    fresh.setenv(name, value)
    torch.set_num_threads(4)
    threads.use_available_cpus(four_cores_quota_one_and_a_half)
    assert torch.get_num_threads() == 4 and value in threads.STATE.count


def test_a_loaded_libgomp_is_seen_in_the_memory_map(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")  # only for this check: the map decides
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libgomp-a34b3233.so.1\n")  # another wheel's copy
    assert not threads.openmp_loaded(maps)
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1\n")
    assert threads.openmp_loaded(maps)
    assert not threads.openmp_loaded(tmp_path / "missing")
