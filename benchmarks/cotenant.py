"""hfbert and its peers on a shared CPU (issue 71): each engine's time with a neighbour process beside it, and under a
CPU quota, against its own time alone, all engines measured in the same run.

    pip install -e ".[bench]"      # ONNX Runtime, OpenVINO, CTranslate2; a missing one is skipped, with why
    python -m benchmarks.cotenant [--shape small|base] [--rounds 3] [--quick] [--duty 0.5]
        [--conditions idle,busy,matmul,quota] [--engines ...] [--variant NAME:VAR=VALUE,...] [--json OUT.json]

Run from the repository root. On a 2-core machine with other work beside it, `--quick --rounds 2` with every
engine took 25 minutes (the workers with libgomp's default policy are the slow ones there).

Engines (benchmarks/peer_engines.py's, on the same random weights: `--shape small`, the default, is bert-base-uncased's
file layout at all-MiniLM-L6-v2's size, 6 layers of hidden 384; `--shape base` is bert-base): hfbert after
`optimize_for_inference` (fp32; "hfbert int8", quantize="int8"; "hfbert bf16 mode", precision="bf16", where the CPU
computes bf16 natively), ONNX Runtime fp32 and int8 (the fused graph), OpenVINO (f32 hint, and its default precision
where that is bf16), CTranslate2 float32 and int8. Every engine runs in a worker process of its own, so that each keeps
its own OpenMP runtime and thread settings, as a deployed server would; the workers import hfbert before anything else,
as a user's `import hfbert` does. Each hfbert engine runs as hfbert runs by default (libgomp's own wait policy) and
again with `HFBERT_THREADS=shared` (OpenMP's passive wait policy, hfbert/platform/threads.py): the paired before/after
of that setting, in the same rounds. `--variant NAME:VAR=VALUE,...` adds more hfbert workers, the setting off and these
variables set (an experiment: `--variant spin10k:GOMP_SPINCOUNT=10000`).

Workloads (the issue's): "1x16 x4", four calls at batch 1 x 16 tokens (their total); "dense 8x128"; "mixed", the
peers' mixed lengths (log-normal, median 60; 64 sequences, 32 with --quick) in arrival order, batches of 32, padded
to each batch's longest; "sorted", the same longest first.

Conditions, taking turns within each round (the order rotating), so that the machine's own drift lands on all:
  idle     no neighbour started (other processes on the machine still run: the report says how much)
  busy     a neighbour process that keeps `--duty` (0.5) of one core busy in a plain loop: it spins until it has
           used duty x 10 ms of CPU, then sleeps to the end of its 10 ms period
  matmul   the same neighbour doing 192 x 192 float32 matrix products (numpy, one thread) instead of a plain loop
  quota    no neighbour; the engines' own second set of workers, started under a CPU limit of one core fewer than
           the machine shows: a cgroup CPU quota (cgroup v2 cpu.max or v1 cpu.cfs_quota_us) where this process may
           create one, else a CPU affinity (`os.sched_setaffinity`) of fewer cores. A quota, as a Kubernetes pod gets,
           is visible to no library's default thread count; an affinity set before a process starts is
Threads: each peer gets `--threads` (default: the CPUs this process may run on); hfbert keeps the thread count torch
and hfbert's setting chose, unless `--threads` is given. The workers' thread counts are printed.

Reported per workload and condition: each engine's median seconds, its slowdown (condition / idle), and each
engine's time over hfbert fp32's (above 1: hfbert faster). Also the CPU, the load averages before and after, the
cores the neighbour really used, and the cores other processes (not this run's) kept busy per condition: on a
shared machine that is noise no design removes, only pairing and repeats reduce.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Light imports only at the top: the neighbour process runs this module too, and must not load torch or OpenMP.

HFBERT_ENGINES = ("hfbert", "hfbert int8", "hfbert bf16 mode")
PEER_ENGINES = (
    "ONNX Runtime",
    "ONNX Runtime int8",
    "OpenVINO",
    "OpenVINO (default precision)",
    "CTranslate2",
    "CTranslate2 int8",
)
WORKLOADS = ("1x16 x4", "dense 8x128", "mixed", "sorted")
CONDITIONS = ("idle", "busy", "matmul", "quota")
NEIGHBOURS = {"busy": "loop", "matmul": "matmul"}
SHARED = "shared"  # the rows of the workers with HFBERT_THREADS=shared
SWITCH = "HFBERT_THREADS"  # hfbert/platform/threads.py's off switch (read there; named here to stay import-light)
PERIOD = 0.01  # the neighbour's duty period, seconds
NEIGHBOUR_LIMIT = 900.0  # seconds: a neighbour left behind by a killed run stops by itself
SETTLE = 0.05  # untimed pause before each turn: the previous worker's spinning threads go back to sleep
SMALL_SHAPE = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 12}
CGROUP_ROOT = Path("/sys/fs/cgroup")


# -- the neighbour -----------------------------------------------------------------------------------------------------
def neighbour(kind: str, duty: float, limit: float = NEIGHBOUR_LIMIT) -> None:
    """Keep `duty` of one core busy (a plain loop, or `kind="matmul"` matrix products), period by period, for at most
    `limit` seconds: it spins until this period's CPU time reaches duty x PERIOD, so that a neighbour starved by the
    scheduler still asks for its share, then sleeps to the period's end."""
    product = None
    if kind == "matmul":
        import numpy

        matrix = numpy.random.default_rng(0).random((192, 192), dtype=numpy.float32)
        product = lambda: matrix @ matrix  # noqa: E731
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        started, cpu = time.monotonic(), time.thread_time()
        while time.thread_time() - cpu < duty * PERIOD and time.monotonic() - started < 4 * PERIOD:
            if product is not None:
                product()
        time.sleep(max(0.0, PERIOD - (time.monotonic() - started)))


def start_neighbour(kind: str, duty: float) -> subprocess.Popen:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    code = f"from benchmarks.cotenant import neighbour; neighbour({kind!r}, {duty!r})"
    return subprocess.Popen([sys.executable, "-c", code], env=environment)


# -- the CPU limit of the quota condition ------------------------------------------------------------------------------
class CpuLimit:
    """One core fewer than the machine shows, for the quota workers: a cgroup CPU quota where this process can create
    a cgroup (removed again by `close`), else a CPU affinity set in the worker before it starts."""

    def __init__(self, cores: int) -> None:
        self.cores, self.group, self.tasks = cores, None, None
        self.description = f"affinity: {cores} of {os.cpu_count()} cores (os.sched_setaffinity before start)"
        period = 100_000
        name = f"hfbert-cotenant-{os.getpid()}"
        if (CGROUP_ROOT / "cgroup.controllers").exists():  # cgroup v2
            group, quota_file, value, tasks = (
                CGROUP_ROOT / name,
                "cpu.max",
                f"{cores * period} {period}",
                "cgroup.procs",
            )
        else:
            group, quota_file, value, tasks = (
                CGROUP_ROOT / "cpu" / name,
                "cpu.cfs_quota_us",
                str(cores * period),
                "tasks",
            )
        try:
            group.mkdir()
        except OSError:
            return
        try:
            (group / quota_file).write_text(value)
        except OSError:  # no CPU controller there: the affinity instead
            group.rmdir()
            return
        self.group, self.tasks = group, group / tasks
        self.description = f"cgroup quota: {cores} CPU of {os.cpu_count()} ({group / quota_file}: {value})"

    def enter(self) -> None:
        """In the worker, before it starts (a `preexec_fn`)."""
        if self.tasks is not None:
            self.tasks.write_text(str(os.getpid()))
        else:
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: self.cores])

    def close(self) -> None:
        if self.group is not None:
            with contextlib.suppress(OSError):  # a worker still inside: the group is empty and harmless
                self.group.rmdir()


# -- workers -----------------------------------------------------------------------------------------------------------
def build_engine(name: str, checkpoint: Path, artifacts: dict, hidden: int, threads: int) -> Any:
    """One engine as benchmarks/peer_engines.py builds it."""
    from benchmarks import peer_engines
    from hfbert.inference.bf16 import bf16_available
    from hfbert.tools.parity.engines import ctranslate2_engine, onnxruntime_engine

    def needs(key: str) -> Path:
        if key not in artifacts:
            raise peer_engines.EngineUnavailableError(f"its artifact ({key}) could not be built")
        return Path(artifacts[key])

    if name == "hfbert":
        return peer_engines.hfbert_engine(checkpoint)
    if name == "hfbert int8":
        return peer_engines.hfbert_engine(checkpoint, quantize="int8")
    if name == "hfbert bf16 mode":
        if not bf16_available():
            raise peer_engines.EngineUnavailableError("bf16 is emulated on this CPU: not timed")
        return peer_engines.hfbert_engine(checkpoint, precision="bf16")
    if name == "ONNX Runtime":
        return peer_engines.artifact_engine(onnxruntime_engine.load(needs("fused"), hidden, threads))
    if name == "ONNX Runtime int8":
        return peer_engines.artifact_engine(onnxruntime_engine.load(needs("int8"), hidden, threads))
    if name == "OpenVINO":
        return peer_engines.openvino_engine_at(needs("plain"), hidden, threads, "f32")
    if name == "OpenVINO (default precision)":
        return peer_engines.openvino_engine_at(needs("plain"), hidden, threads, "default")
    compute_type = {"CTranslate2": "float32", "CTranslate2 int8": "int8"}[name]
    return peer_engines.artifact_engine(
        ctranslate2_engine.load(needs("ctranslate2"), hidden, threads, compute_type=compute_type)
    )


def workloads(mixed_count: int) -> dict[str, tuple[list[dict], int]]:
    """Each workload's batches and how many calls a turn makes on each."""
    from benchmarks.benchmark import batch, mixed_batches
    from benchmarks.peer_measurement import sorted_by_length

    mixed = mixed_batches(mixed_count, "cpu")
    return {
        "1x16 x4": ([batch([16], 1001, "cpu")], 4),
        "dense 8x128": ([batch([128] * 8, 1000, "cpu")], 1),
        "mixed": (mixed, 1),
        "sorted": (sorted_by_length(mixed), 1),
    }


def worker(spec: dict) -> int:
    """One engine's process: builds it, then answers each request (a workload's name) with the seconds of one turn,
    pickled on its stdout."""
    import hfbert  # isort: skip  first, as a user's program: hfbert's OpenMP settings apply before torch loads

    import torch

    from hfbert.platform.threads import threads_setting

    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the pipe carries answers only
    is_hfbert = spec["engine"] in HFBERT_ENGINES
    if spec["threads"] and is_hfbert:
        torch.set_num_threads(spec["threads"])
    threads = spec["threads"] or len(os.sched_getaffinity(0))
    hello: dict[str, Any] = {"threads": torch.get_num_threads() if is_hfbert else threads, "hfbert": hfbert.__version__}
    try:
        engine = build_engine(spec["engine"], Path(spec["checkpoint"]), spec["artifacts"], spec["hidden"], threads)
    except Exception as error:
        hello["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200] if str(error) else ''}"
        pickle.dump(hello, answers)
        answers.flush()
        return 0
    hello["notes"] = engine.notes[:1]
    hello["setting"] = threads_setting() if is_hfbert else None
    feeds = {
        name: ([engine.prepare(inputs) for inputs in batches], calls)
        for name, (batches, calls) in workloads(spec["mixed_count"]).items()
    }
    with torch.inference_mode():
        for feed, _ in feeds.values():  # warm-up: every shape once
            for prepared in feed:
                engine.run(prepared)
        pickle.dump(hello, answers)
        answers.flush()
        for line in sys.stdin:
            feed, calls = feeds[line.strip()]
            started = time.perf_counter()
            for prepared in feed:
                for _ in range(calls):
                    engine.run(prepared)
            pickle.dump(time.perf_counter() - started, answers)
            answers.flush()
    return 0


class Worker:
    """The parent's side of one worker process: `ask(workload)` -> its answer (seconds, here). `module` is the
    benchmark whose `--worker SPEC` the process runs (benchmarks/batch1_aot.py's workers answer in their own terms)."""

    def __init__(
        self, spec: dict, environment: dict[str, str], limit: CpuLimit | None, module: str = "benchmarks.cotenant"
    ) -> None:
        command = [sys.executable, "-m", module, "--worker", json.dumps(spec)]
        preexec = limit.enter if limit else None
        self.process = subprocess.Popen(
            command, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=preexec
        )
        self.hello: dict | None = None

    def ready(self) -> dict:
        if self.hello is None:
            try:
                self.hello = pickle.load(self.process.stdout)
            except EOFError:
                self.hello = {"error": f"the worker exited ({self.process.wait()}) before it was ready"}
        return self.hello

    def ask(self, workload: str) -> Any:
        self.process.stdin.write(f"{workload}\n".encode())
        self.process.stdin.flush()
        return pickle.load(self.process.stdout)

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (its threads included), 0 where it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    fields = [int(value) for value in Path("/proc/stat").read_text().split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


# -- the run -----------------------------------------------------------------------------------------------------------
def small_checkpoint(directory: Path) -> Path:
    """bert-base-uncased's file layout at all-MiniLM-L6-v2's size (SMALL_SHAPE), random weights (seeded)."""
    from tests.support.checkpoints import bert_base_shapes, random_tensors, reference_config, write_checkpoint

    base = reference_config()
    resize = {
        base["hidden_size"]: SMALL_SHAPE["hidden_size"],
        base["intermediate_size"]: SMALL_SHAPE["intermediate_size"],
    }
    shapes = {}
    for name, shape in bert_base_shapes().items():
        layer = name.partition(".layer.")[2].partition(".")[0]
        if not layer or int(layer) < SMALL_SHAPE["num_hidden_layers"]:
            shapes[name] = [resize.get(size, size) for size in shape]
    tensors = random_tensors(shapes, seed=0, weight_std=0.02, gain_std=0.0)
    return write_checkpoint(directory, tensors, {**base, **SMALL_SHAPE})


def engine_specs(args: argparse.Namespace) -> list[tuple[str, dict[str, str]]]:
    """(the row's name, the variables its worker adds) for every engine worker of one CPU limit."""
    rows: list[tuple[str, dict[str, str]]] = []
    for engine in args.engines:
        rows.append((engine, {}))
        if engine in HFBERT_ENGINES:
            if args.compare_setting:
                rows.append((f"{engine} ({SHARED})", {SWITCH: SHARED}))
            for name, variables in args.variant:
                rows.append((f"{engine} ({name})", {SWITCH: "off", **variables}))
    return rows


def start_workers(
    args: argparse.Namespace, checkpoint: Path, artifacts: dict, hidden: int, limit: CpuLimit | None
) -> dict[str, Worker]:
    base = {name: value for name, value in os.environ.items() if name != SWITCH}
    workers = {}
    for row, variables in engine_specs(args):
        engine = row.partition(" (")[0] if row.partition(" (")[0] in HFBERT_ENGINES else row
        spec = {
            "engine": engine,
            "checkpoint": str(checkpoint),
            "artifacts": {key: str(value) for key, value in artifacts.items() if isinstance(value, Path)},
            "hidden": hidden,
            "threads": args.threads,
            "mixed_count": args.mixed_count,
        }
        workers[row] = Worker(spec, {**base, **variables}, limit)
        workers[row].ready()  # one at a time: building engines side by side would double every build's time
    return workers


def measure(args: argparse.Namespace) -> dict:
    import hfbert
    from benchmarks.benchmark import make_checkpoint
    from benchmarks.peer_engines import build_artifacts
    from hfbert.platform.cpu import cpu_name, instruction_set

    loads = [os.getloadavg()]
    result: dict[str, Any] = {
        "machine": {
            "cpu": cpu_name(),
            "instruction_set": instruction_set(),
            "cores": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)),
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
        "args": {key: str(value) for key, value in vars(args).items()},
        "skipped": {},
    }
    limit = CpuLimit(max(1, len(os.sched_getaffinity(0)) - 1)) if "quota" in args.conditions else None
    workers: dict[str, dict[str, Worker]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="hfbert-cotenant-") as temporary:
            work = Path(temporary)
            progress("building the checkpoint, the ONNX files and the CTranslate2 model")
            checkpoint = (make_checkpoint if args.shape == "base" else small_checkpoint)(work / "bert")
            config = hfbert.BertConfig.from_json_file(checkpoint / "config.json")
            peers_wanted = any(engine in PEER_ENGINES for engine in args.engines)
            artifacts = {}
            if peers_wanted:
                ctranslate2 = not any(engine.startswith("CTranslate2") for engine in args.engines)
                artifacts = build_artifacts(checkpoint, work, config, result["skipped"], ctranslate2)
            result["shape"] = {key: getattr(config, key) for key in SMALL_SHAPE}
            groups = {"shown": None}
            if limit is not None:
                groups["limited"] = limit
                result["machine"]["quota"] = limit.description
            for group, group_limit in groups.items():
                progress(f"starting the {group} workers")
                workers[group] = start_workers(args, checkpoint, artifacts, config.hidden_size, group_limit)
                for row, worker in list(workers[group].items()):
                    if "error" in worker.ready():
                        result["skipped"][f"{row} ({group})"] = worker.ready()["error"]
                        worker.close()
                        del workers[group][row]
            result["workers"] = {
                group: {row: worker.ready() for row, worker in members.items()} for group, members in workers.items()
            }
            result["times"] = run_rounds(args, workers, result)
    finally:
        for members in workers.values():
            for worker in members.values():
                worker.close()
        if limit is not None:
            limit.close()
    loads.append(os.getloadavg())
    result["machine"]["load_before"], result["machine"]["load_after"] = loads
    return result


def run_rounds(args: argparse.Namespace, workers: dict[str, dict[str, Worker]], result: dict) -> dict:
    """times[condition][workload][row]: seconds per turn, one per round. Also records, per condition, the cores the
    neighbour used and the cores other processes (not this run's) kept busy."""
    times: dict[str, dict[str, dict[str, list[float]]]] = {
        condition: {workload: {} for workload in args.workloads} for condition in args.conditions
    }
    spent = {condition: {"seconds": 0.0, "neighbour": 0.0, "others": 0.0} for condition in args.conditions}
    for index in range(args.rounds):
        shift = index % len(args.conditions)
        for condition in args.conditions[shift:] + args.conditions[:shift]:
            progress(f"round {index + 1} of {args.rounds}: {condition}")
            members = workers["limited" if condition == "quota" else "shown"]
            mine = list(members.values())
            kind = NEIGHBOURS.get(condition)
            side = start_neighbour(kind, args.duty) if kind else None
            time.sleep(0.3 if side else 0.0)  # the neighbour's import done before the clock starts
            cpu_before = [worker.cpu_seconds() for worker in mine] + [process_cpu_seconds(side.pid) if side else 0.0]
            started, busy_before, own_before = time.monotonic(), machine_busy_seconds(), own_cpu_seconds()
            for workload in args.workloads:
                rows = list(members)
                rows = rows[index % len(rows) :] + rows[: index % len(rows)]
                for row in rows:
                    time.sleep(SETTLE)
                    times[condition][workload].setdefault(row, []).append(members[row].ask(workload))
            seconds = time.monotonic() - started
            cpu_after = [worker.cpu_seconds() for worker in mine] + [process_cpu_seconds(side.pid) if side else 0.0]
            busy = machine_busy_seconds() - busy_before - (own_cpu_seconds() - own_before)
            run_cpu = sum(after - before for before, after in zip(cpu_before, cpu_after, strict=True))
            spent[condition]["seconds"] += seconds
            spent[condition]["neighbour"] += cpu_after[-1] - cpu_before[-1]
            spent[condition]["others"] += max(0.0, busy - run_cpu)
            if side:
                side.kill()
                side.wait()
    result["cores"] = {
        condition: {
            "neighbour": values["neighbour"] / values["seconds"] if values["seconds"] else None,
            "others": values["others"] / values["seconds"] if values["seconds"] else None,
        }
        for condition, values in spent.items()
    }
    return times


def own_cpu_seconds() -> float:
    own = os.times()
    return own.user + own.system


# -- the report --------------------------------------------------------------------------------------------------------
def medians(result: dict) -> dict[str, dict[str, dict[str, float]]]:
    return {
        condition: {
            workload: {row: statistics.median(values) for row, values in rows.items()} for workload, rows in by.items()
        }
        for condition, by in result["times"].items()
    }


def markdown(result: dict) -> str:
    machine, cores = result["machine"], result["cores"]
    median = medians(result)
    conditions = list(result["times"])
    shared = [condition for condition in conditions if condition != "idle"]
    load = lambda values: ", ".join(f"{value:.2f}" for value in values)  # noqa: E731
    lines = [
        f"Machine: {machine['cpu']} ({machine['instruction_set']}), {machine['cores']} cores, {machine['affinity']} "
        f"in this process's affinity; measured {machine['measured']}; load average before "
        f"{load(machine['load_before'])}, after {load(machine['load_after'])}. Shape: {result['shape']}.",
        "Cores other processes (not this run's) kept busy, per condition: "
        + "; ".join(f"{condition} {cores[condition]['others']:.2f}" for condition in conditions)
        + ". The neighbour used: "
        + "; ".join(
            f"{condition} {cores[condition]['neighbour']:.2f}" for condition in shared if condition in NEIGHBOURS
        )
        + (f". Quota: {machine['quota']}." if "quota" in machine else "."),
        "Threads: "
        + "; ".join(
            f"{row} {hello['threads']}" + (f" [{hello['setting']}]" if hello.get("setting") else "")
            for row, hello in result["workers"]["shown"].items()
        ),
    ]
    if "limited" in result["workers"]:
        lines.append(
            "Threads under the quota: "
            + "; ".join(f"{row} {hello['threads']}" for row, hello in result["workers"]["limited"].items())
        )
    for key, why in result["skipped"].items():
        lines.append(f"Skipped {key}: {why}")
    for workload in next(iter(result["times"].values())):
        rows = list(median["idle"][workload]) if "idle" in median else list(median[conditions[0]][workload])
        lines += ["", f"**{workload}**: median ms per turn, (slowdown against idle), [time / hfbert's]", ""]
        lines.append("| engine | " + " | ".join(conditions) + " |")
        lines.append("|---" * (len(conditions) + 1) + "|")
        for row in rows:
            cells = []
            for condition in conditions:
                value = median[condition][workload].get(row)
                if value is None:
                    cells.append("-")
                    continue
                cell = f"{value * 1e3:.1f}"
                if condition != "idle" and "idle" in median and row in median["idle"][workload]:
                    cell += f" ({value / median['idle'][workload][row]:.2f}x)"
                reference = median[condition][workload].get("hfbert")
                if reference and row != "hfbert":
                    cell += f" [{value / reference:.2f}]"
                cells.append(cell)
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", goal_lines(median)]
    return "\n".join(lines)


def goal_lines(median: dict) -> str:
    """Issue 71's goal per shared condition and workload: each hfbert engine's slowdown no worse than the slowest-
    degrading peer's."""
    if "idle" not in median:
        return ""
    out = ["Goal (issue 71): each hfbert engine's slowdown <= the slowest-degrading peer's:"]
    for condition in (condition for condition in median if condition != "idle"):
        for workload, rows in median[condition].items():
            idle = median["idle"][workload]
            slowdown = {row: value / idle[row] for row, value in rows.items() if row in idle}
            peers = [value for row, value in slowdown.items() if row in PEER_ENGINES]
            if not peers:
                continue
            worst = max(peers)
            mine = {row: value for row, value in slowdown.items() if row in HFBERT_ENGINES}
            verdict = ", ".join(
                f"{row} {value:.2f}x {'met' if value <= worst else 'MISSED'}" for row, value in mine.items()
            )
            out.append(f"- {condition}, {workload}: worst peer {worst:.2f}x; {verdict}")
    return "\n".join(out)


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition(":")
    pairs = [item.partition("=") for item in assignments.split(",") if item]
    if not name or not pairs or any(not key or not sep for key, sep, _ in pairs):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME:VAR=VALUE[,VAR=VALUE...]")
    return name, {key: value for key, _, value in pairs}


def names(allowed: tuple[str, ...], what: str) -> Any:
    def parse(text: str) -> list[str]:
        chosen = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in chosen if item not in allowed]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"--{what} {text!r}: choose from {', '.join(allowed)}")
        return chosen

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("small", "base"), default="small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="32 mixed sequences, not 64")
    parser.add_argument("--duty", type=float, default=0.5, help="the neighbour's share of one core (0 < duty <= 1)")
    parser.add_argument("--threads", type=int, default=0, help="every engine's thread count (default: their own)")
    parser.add_argument("--conditions", type=names(CONDITIONS, "conditions"), default=list(CONDITIONS))
    parser.add_argument("--workloads", type=names(WORKLOADS, "workloads"), default=list(WORKLOADS))
    parser.add_argument(
        "--engines", type=names(HFBERT_ENGINES + PEER_ENGINES, "engines"), default=list(HFBERT_ENGINES + PEER_ENGINES)
    )
    parser.add_argument("--variant", type=variant, action="append", default=[], help="NAME:VAR=VALUE,...")
    parser.add_argument(
        "--no-compare-setting",
        dest="compare_setting",
        action="store_false",
        help="no hfbert workers with HFBERT_THREADS=shared",
    )
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 < args.duty <= 1:
        parser.error(f"--duty {args.duty}: expected a share of one core, above 0 and at most 1")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    if args.json and not args.json.resolve().parent.is_dir():
        parser.error(f"--json {args.json}: the folder {args.json.resolve().parent} does not exist")
    if args.json and args.json.exists():
        parser.error(f"--json {args.json}: exists; not overwritten (choose a new name)")
    args.mixed_count = 32 if args.quick else 64
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    result = measure(args)
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
