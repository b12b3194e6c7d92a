"""torch's threads on a shared CPU: no more threads than the CPUs this process may use (at `import hfbert`, where the
user set nothing), and, asked for with `HFBERT_THREADS=shared`, OpenMP's passive wait policy set before torch loads.

torch's x86 wheels run every parallel region (its own kernels, oneDNN's and MKL's products) on GNU OpenMP (the
libgomp in torch/lib). By default libgomp's threads spin for about 300,000 turns (milliseconds) after each region
before they sleep, and split each region's work into one fixed share per thread. On a machine where another process
runs beside hfbert (a tokenizer, an HTTP worker, another Ray actor, a test run), the scheduler preempts one of the
threads; the other finishes its share and spins, so its core never goes idle and the kernel never moves the
preempted thread onto it: every region waits a time slice for the preempted share. A forward at a small batch is
hundreds of short regions, and hfbert's time collapses (issue 71). ONNX Runtime and OpenVINO split work dynamically
in pools of their own and lose far less. `OMP_WAIT_POLICY=PASSIVE` makes a waiting thread sleep at once: its core
goes idle, the kernel moves the preempted thread there, and the region ends at about the speed of the cores left
(`python -m benchmarks.cotenant` measures both, paired; docs/cpu-inference.md has the numbers). The price: on a
dedicated, idle machine a woken thread starts later than a spinning one, measurably at small shapes (up to 1.4x on
the one CPU measured so far). So it is not the default: a default that makes an idle machine slower needs
measurements on more than one CPU family first. `HFBERT_THREADS=shared` asks for it.

libgomp reads its variables once, when it loads, which is when torch is imported. `use_passive_wait()` (the first
thing `import hfbert` runs, before anything of hfbert imports torch) sets the policy where

- `HFBERT_THREADS` is `shared` (asked for; `off` leaves this setting and the next alone),
- the user set neither `OMP_WAIT_POLICY` nor `GOMP_SPINCOUNT` (a user's choice is never changed),
- no libgomp is loaded in this process yet (a program that imported torch before hfbert: too late, `threads_setting`
  says so and names the way out, `export OMP_WAIT_POLICY=PASSIVE`),

then imports torch, so that libgomp reads it, and puts the environment back as it was: the policy holds for this
process, and child processes start from the user's own environment.

The thread count: torch starts one thread per core of the process's CPU affinity, but nothing in it reads a cgroup
CPU quota (a Kubernetes pod's CPU limit, `docker run --cpus`): a pod limited to one CPU on a 16-core node runs 16
threads, and the quota stops them all for most of each period. `use_available_cpus()` lowers torch's count to the
CPUs available, the fewer of the affinity's cores and the quota rounded up, where it is above that and the user set
neither `OMP_NUM_THREADS` nor `MKL_NUM_THREADS` nor `HFBERT_THREADS=off`. Never raised: a lower count is the user's.

    >>> from hfbert.platform.threads import threads_setting
    >>> threads_setting()  # doctest: +SKIP
    "libgomp's default (HFBERT_THREADS=shared or OMP_WAIT_POLICY=PASSIVE on a shared CPU); 2 threads (...)"
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

SETTING = "OMP_WAIT_POLICY"
POLICY = "PASSIVE"
SWITCH = "HFBERT_THREADS"  # "off": leave OpenMP's wait policy and torch's thread count alone; "shared": passive
SHARED = "shared"
USER_WAIT_SETTINGS = (SETTING, "GOMP_SPINCOUNT")
USER_COUNT_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class ThreadState:
    """What this process knows of its OpenMP settings: set by `use_passive_wait` and `use_available_cpus`."""

    wait: str | None = None  # the wait policy libgomp runs and why (None: use_passive_wait has not run)
    count: str | None = None  # torch's thread count and why (None: use_available_cpus has not run)


STATE = ThreadState()


def switched_off() -> bool:
    return os.environ.get(SWITCH, "").strip().lower() == "off"


def asked_for_shared() -> bool:
    return os.environ.get(SWITCH, "").strip().lower() == SHARED


def openmp_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether torch, or the GNU OpenMP runtime it links (`libgomp.so.1`: the dynamic loader shares one copy per
    name), is already in this process: then libgomp has read its variables."""
    if "torch" in sys.modules:
        return True
    try:
        return any(line.rstrip().endswith("/libgomp.so.1") for line in maps.read_text().splitlines())
    except OSError:
        return False


def use_passive_wait() -> None:
    """Set `OMP_WAIT_POLICY=PASSIVE` for torch's OpenMP threads, before torch loads it, where `HFBERT_THREADS=shared`
    asks for it, unless the user set a wait policy or spin count, or OpenMP is already loaded. Runs once per process;
    the environment is put back as it was, for child processes."""
    if STATE.wait is not None:
        return
    user = [name for name in USER_WAIT_SETTINGS if os.environ.get(name)]
    if switched_off():
        STATE.wait = f"libgomp's default ({SWITCH}=off)"
    elif user:
        STATE.wait = ", ".join(f"{name}={os.environ[name]}" for name in user) + " (set in the environment)"
    elif not asked_for_shared():
        STATE.wait = f"libgomp's default ({SWITCH}={SHARED} or {SETTING}={POLICY} on a shared CPU)"
    elif openmp_loaded():
        STATE.wait = (
            "libgomp's default: torch was imported before hfbert, too late to set its wait policy; "
            f"on a shared CPU: export {SETTING}={POLICY}"
        )
    else:
        os.environ[SETTING] = POLICY
        try:
            import torch  # noqa: F401  libgomp reads its variables when torch loads it: now
        finally:
            del os.environ[SETTING]
        STATE.wait = f"{SETTING}={POLICY} (set by hfbert)"


def cgroup_cpu_quota(root: Path = Path("/")) -> float | None:
    """The CPUs this process's cgroup quota allows (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
    `cpu.cfs_period_us`; the smallest along the path to the hierarchy's root), or None where there is none or it
    cannot be read. `root`: where /proc and the cgroup file systems are found (a test's fake tree)."""
    try:
        memberships = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in memberships:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        version2 = number == "0" and controllers == ""
        if not version2 and "cpu" not in controllers.split(","):
            continue
        for directory in cgroup_directories(mounts, path, version2, root):
            quota = read_quota(directory, version2)
            if quota is not None:
                quotas.append(quota)
    return min(quotas, default=None)


def cgroup_directories(mounts: list[str], path: str, version2: bool, root: Path) -> list[Path]:
    """The cgroup's directory and those above it, up to the mount of its hierarchy (mountinfo's fields: the mount's
    own cgroup path is the 4th, its mount point the 5th, the file system type after the " - ")."""
    for mount in mounts:
        fields, _, tail = mount.partition(" - ")
        fields, tail = fields.split(), tail.split()
        if len(fields) < 5 or not tail:
            continue
        wanted = tail[0] == "cgroup2" if version2 else tail[0] == "cgroup" and "cpu" in tail[-1].split(",")
        if not wanted:
            continue
        mount_root, point = fields[3], root / fields[4].lstrip("/")
        relative = os.path.relpath(path, mount_root) if path.startswith(mount_root) else "."
        parts = [] if relative == "." else Path(relative).parts
        return [point.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return []


def read_quota(directory: Path, version2: bool) -> float | None:
    try:
        if version2:
            quota, _, period = (directory / "cpu.max").read_text().strip().partition(" ")
        else:
            quota = (directory / "cpu.cfs_quota_us").read_text().strip()
            period = (directory / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    if quota in ("max", "-1") or not period or int(period) <= 0 or int(quota) <= 0:
        return None
    return int(quota) / int(period)


def available_cpus(root: Path = Path("/")) -> tuple[int, str]:
    """The CPUs this process may use (the fewer of its affinity's cores and its cgroup quota, rounded up) and what
    limits it, in words."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    if quota is not None and math.ceil(quota) < affinity:
        return max(1, math.ceil(quota)), f"cgroup CPU quota {quota:g} of {affinity} cores"
    return affinity, f"{affinity} cores in its CPU affinity"


def use_available_cpus(root: Path = Path("/")) -> None:
    """Lower torch's thread count to the CPUs this process may use (`available_cpus`), unless the user set
    `OMP_NUM_THREADS` or `MKL_NUM_THREADS`, or `HFBERT_THREADS=off`. Never raises it. Runs once per process."""
    if STATE.count is not None:
        return
    import torch

    user = [name for name in USER_COUNT_SETTINGS if os.environ.get(name)]
    threads = torch.get_num_threads()
    if switched_off():
        STATE.count = f"{threads} threads (torch's count, {SWITCH}=off)"
    elif user:
        STATE.count = f"{threads} threads (" + ", ".join(f"{name}={os.environ[name]}" for name in user) + ")"
    else:
        cpus, why = available_cpus(root)
        if threads > cpus:
            torch.set_num_threads(cpus)
            STATE.count = f"{cpus} threads (set by hfbert, torch had {threads}: {why})"
        else:
            STATE.count = f"{threads} threads (torch's count; {why})"


def use_shared_cpu_settings() -> None:
    """Both settings, in order: the wait policy before torch loads, then the count. What `import hfbert` runs first."""
    use_passive_wait()
    use_available_cpus()


def threads_setting() -> str:
    """OpenMP's wait policy and torch's thread count in this process, and why, for reports: "OMP_WAIT_POLICY=PASSIVE
    (set by hfbert); 2 threads (torch's count; 2 cores in its CPU affinity)"."""
    wait = STATE.wait or (
        f"{SETTING}={os.environ[SETTING]}" if os.environ.get(SETTING) else "libgomp's default (hfbert did not set it)"
    )
    if STATE.count is None:
        import torch

        return f"{wait}; {torch.get_num_threads()} threads (hfbert did not set them)"
    return f"{wait}; {STATE.count}"


# Importing this module applies both settings: `hfbert/__init__.py` imports it before anything else, because the
# wait policy only counts before torch is imported.
use_shared_cpu_settings()
