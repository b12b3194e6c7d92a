"""What the compiled paths cost before their first answer: a cold process, then a warm one (issue 43, part 2).

    python -m benchmarks.compile_cost [--shapes 1x16,8x128] [--threads N]      # about 5 minutes on 2 cores

For each compiled mode of `optimize_for_inference` (fp32 `precision="highest"` and `"high"`, int8) and each shape,
on bert-base-uncased's exact layout with random weights: a fresh process with an empty inductor cache
(`TORCHINDUCTOR_CACHE_DIR`, a new temporary folder) makes the first call of that shape (compiling, autotuning, and
for fp32 timing the graph against eager), then a second fresh process with the cache the first one left does the
same. Prints both first-call times, the time of a call once compiled, and the size of the cache folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {
    "fp32 compiled": {"compile": True},
    "fp32 high compiled": {"precision": "high", "compile": True},
    "int8 compiled": {"quantize": "int8", "compile": True},
}


def worker(mode: str, checkpoint: Path, shape: tuple[int, int], threads: int) -> dict:
    import torch

    import hfbert
    from hfbert.inference.compiled import compile_report, eager_shapes

    torch.set_num_threads(threads)
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(checkpoint), **MODES[mode])
    ids = torch.randint(1000, 20000, shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        started = time.perf_counter()
        model(input_ids=ids)
        first = time.perf_counter() - started
        times = []
        for _ in range(5):
            started = time.perf_counter()
            model(input_ids=ids)
            times.append(time.perf_counter() - started)
    return {
        "first_s": first,
        "call_ms": sorted(times)[2] * 1e3,
        "compiled": len(compile_report(model)),
        "eager_measured_faster": bool(eager_shapes(model)),
    }


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def run_worker(mode: str, checkpoint: Path, shape: tuple[int, int], threads: int, cache: Path) -> dict:
    command = [sys.executable, "-m", "benchmarks.compile_cost", "--worker", mode, str(checkpoint)]
    command += ["--shapes", f"{shape[0]}x{shape[1]}", "--threads", str(threads)]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} {shape}: exit code {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="1x16,8x128")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "CHECKPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [tuple(int(size) for size in text.split("x")) for text in args.shapes.split(",")]
    if args.worker:
        print(json.dumps(worker(args.worker[0], Path(args.worker[1]), shapes[0], args.threads)))
        return 0
    from hfbert.platform.cpu import cpu_name, instruction_set
    from tests.support.checkpoints import write_bert_base_layout

    print(f"Machine: {cpu_name()}; instruction set {instruction_set()}; {args.threads} threads; bert-base layout.\n")
    print("| mode | shape | first call, empty cache | first call, warm cache | call once compiled | cache size |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        checkpoint = Path(work) / "bert-base"
        write_bert_base_layout(checkpoint)
        for mode in MODES:
            for shape in shapes:
                cache = Path(tempfile.mkdtemp(dir=work))
                cold = run_worker(mode, checkpoint, shape, args.threads, cache)
                warm = run_worker(mode, checkpoint, shape, args.threads, cache)
                note = " (eager measured faster: eager runs)" if warm["eager_measured_faster"] else ""
                print(
                    f"| {mode} | {shape[0]}x{shape[1]} | {cold['first_s']:.1f} s | {warm['first_s']:.1f} s "
                    f"| {warm['call_ms']:.1f} ms{note} | {folder_bytes(cache) / 2**20:.1f} MiB |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
