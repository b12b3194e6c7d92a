"""SPLADE encode with the vocabulary projection in the mode's kernel, against the projection in fp32 (issue 69).

    python -m benchmarks.sparse_projection [--rounds 7] [--threads N]   # a few minutes on 2 cores

The int8 and bf16 modes swap the masked-LM decoder (tied to the word embeddings) like every other large linear layer
(`hfbert/inference/optimize.py`); before, it stayed fp32. On benchmarks/peers.py's SPLADE folder (all-MiniLM-L6-v2's
real encoder under a masked-LM head: a 384 x 30,522 projection, max of log1p_relu) each mode's `SparseEncoder` runs
twice: as `optimize_for_inference` leaves it ("projection in int8 / bf16") and with its decoder put back to the plain
`nn.Linear` ("projection fp32", what the mode ran before), fp32 beside them for scale. In each round every engine
runs once, each mode's two back to back in an order alternating from round to round, so that a busy machine slows
both alike: each cell gives the medians over the rounds and the median of the rounds' ratios (and their range).
Shapes: one short text, 8 texts of about 32 tokens, 32 real texts of mixed lengths (batches of 32). Prints the CPU,
its instruction set, the threads and how busy other processes kept the cores; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import hfbert
from benchmarks.busy import BusyMeter
from benchmarks.peer_measurement import real_texts
from benchmarks.peer_retrieval import splade_folder
from hfbert.inference.swapped import Swapped
from hfbert.platform.cpu import cpu_name, instruction_set
from hfbert.tools.parity import default_texts

MODES = {"fp32": {}, "int8": {"quantize": "int8"}, "bf16": {"precision": "bf16"}}


def shapes() -> dict[str, list[str]]:
    sentences = default_texts()
    pairs = [" ".join(sentences[index : index + 2]) for index in range(0, 16, 2)]
    return {"1 short text": sentences[:1], "8 texts of ~32 tokens": pairs, "32 real texts, mixed": real_texts(32)}


def encoders(directory: Path) -> dict[str, hfbert.SparseEncoder]:
    """fp32, and each lossy mode with its projection in its kernel and in fp32 (its decoder swapped back)."""
    built = {"fp32": hfbert.SparseEncoder(directory)}
    for mode in ("int8", "bf16"):
        try:
            swapped = hfbert.SparseEncoder(directory, **MODES[mode])
        except RuntimeError as error:  # a CPU without the mode's kernels
            print(f"{mode}: skipped ({error})")
            continue
        if not isinstance(swapped.model.get_output_embeddings(), Swapped):
            print(f"{mode}: skipped (its kernels do not run here)")
            continue
        plain = hfbert.SparseEncoder(directory, **MODES[mode])
        decoder = plain.model.get_output_embeddings()
        plain.model.cls.predictions.decoder = decoder.swap_out()
        built[f"{mode}, projection fp32"] = plain
        built[f"{mode}, projection {mode}"] = swapped
    return built


def timed(encoder: hfbert.SparseEncoder, texts: list[str]) -> float:
    started = time.perf_counter()
    encoder.encode(texts, batch_size=32)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        built = encoders(splade_folder(Path(scratch) / "splade"))
        meter = BusyMeter()
        print(f"{cpu_name()}, {instruction_set()}, {arguments.threads} threads; SPLADE all-MiniLM-L6-v2, vocab 30522")
        modes = [mode for mode in ("int8", "bf16") if f"{mode}, projection {mode}" in built]
        columns = [f"{mode}: projection fp32 / {mode} (paired ratio)" for mode in modes]
        print("| shape | fp32 | " + " | ".join(columns) + " |\n" + "|---" * (len(modes) + 2) + "|")
        for shape, texts in shapes().items():
            for encoder in built.values():
                timed(encoder, texts)  # warm: the kernels' first call, the allocator
            seconds: dict[str, list[float]] = {name: [] for name in built}
            ratios: dict[str, list[float]] = {mode: [] for mode in modes}
            for turn in range(arguments.rounds):
                seconds["fp32"].append(timed(built["fp32"], texts))
                for mode in modes:
                    # Before and after back to back, their order alternating: each round's ratio sees one load.
                    pair = [f"{mode}, projection fp32", f"{mode}, projection {mode}"][:: 1 if turn % 2 else -1]
                    for name in pair:
                        seconds[name].append(timed(built[name], texts))
                    ratios[mode].append(
                        seconds[f"{mode}, projection fp32"][-1] / seconds[f"{mode}, projection {mode}"][-1]
                    )
            medians = {name: statistics.median(values) * 1e3 for name, values in seconds.items()}
            cells = [
                f"{medians[f'{mode}, projection fp32']:.0f} / {medians[f'{mode}, projection {mode}']:.0f} ms "
                f"({statistics.median(ratios[mode]):.2f}x, rounds {min(ratios[mode]):.2f}-{max(ratios[mode]):.2f})"
                for mode in modes
            ]
            print(f"| {shape} | {medians['fp32']:.0f} ms | " + " | ".join(cells) + " |")
        cores = meter.cores()
    print(
        f"Medians over {arguments.rounds} rounds; (Nx): the median of each round's ratio, the projection in fp32 over "
        f"in the mode's kernel. Other processes kept {'?' if cores is None else f'{cores:.2f}'} cores busy; load "
        f"average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    )


if __name__ == "__main__":
    main()
