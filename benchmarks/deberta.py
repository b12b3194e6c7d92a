"""DeBERTa-v3-base's shape on mixed lengths: hfbert (sdpa, padding-free, the relative terms as a score term) against
transformers (eager, the only attention it has for DeBERTa) and ONNX Runtime (transformers' model exported to ONNX,
`benchmarks/artifacts.py`; skipped, and said, without onnxruntime), taking turns in rounds.

Random weights (the shape decides the time, not the values), the same state dict in both; texts as token ids of
mixed lengths (8 to 256 tokens, in random order, so that every batch holds short and long rows); batches of 16. Each
round runs every batch through every engine, in rotating order, and the result is each engine's median round and
the median of the per-round ratios to transformers, which survives a machine whose load changes between rounds.
Before timing, each engine's outputs are compared with transformers' at real positions. The run records the CPU,
the threads, and the load average and the cores other processes kept busy, before and after (this is not an idle
machine's number unless those say so).

    python -m benchmarks.deberta            # 96 texts, 5 rounds
    python -m benchmarks.deberta --quick    # 32 texts, 3 rounds
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import hfbert
from benchmarks import common
from benchmarks.busy import BusyMeter

# microsoft/deberta-v3-base's config.json (its vocabulary, 128100 rows, too).
DEBERTA_V3_BASE = dict(
    vocab_size=128100,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act="gelu",
    max_position_embeddings=512,
    relative_attention=True,
    position_buckets=256,
    norm_rel_ebd="layer_norm",
    share_att_key=True,
    pos_att_type=["p2c", "c2p"],
    layer_norm_eps=1e-7,
    max_relative_positions=-1,
    position_biased_input=False,
    type_vocab_size=0,
)
BATCH_SIZE = 16
SHORTEST, LONGEST = 8, 256


def mixed_batches(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """`count` rows of token ids, lengths spread log-uniformly over [SHORTEST, LONGEST], in batches of BATCH_SIZE,
    right-padded with 0 (DeBERTa's [PAD])."""
    generator = torch.Generator().manual_seed(seed)
    spread = torch.rand(count, generator=generator)
    lengths = (SHORTEST * (LONGEST / SHORTEST) ** spread).long().tolist()
    batches = []
    for start in range(0, count, BATCH_SIZE):
        rows = lengths[start : start + BATCH_SIZE]
        input_ids = torch.zeros(len(rows), max(rows), dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, length in enumerate(rows):
            input_ids[row, :length] = torch.randint(5, DEBERTA_V3_BASE["vocab_size"], (length,), generator=generator)
            mask[row, :length] = 1
        batches.append({"input_ids": input_ids, "attention_mask": mask})
    return batches


def engines(work: str, threads: int, skipped: dict[str, str]) -> tuple[dict, torch.nn.Module]:
    """name -> a call on one batch (its last hidden state): hfbert's DebertaV2Model with transformers' random weights,
    and ONNX Runtime on transformers' model exported to `work`; and transformers' model, the reference."""
    import transformers

    from benchmarks.artifacts import export_onnx

    torch.manual_seed(0)
    theirs = transformers.DebertaV2Model(transformers.DebertaV2Config(**DEBERTA_V3_BASE)).eval()
    ours = hfbert.DebertaV2Model(hfbert.DebertaV2Config(**DEBERTA_V3_BASE)).eval()
    ours.load_state_dict(theirs.state_dict())
    calls = {
        "hfbert sdpa padding-free": lambda batch: ours(**batch).last_hidden_state,
        "transformers eager": lambda batch: theirs(**batch).last_hidden_state,
    }
    try:
        import onnxruntime
    except ImportError:
        skipped["onnxruntime"] = "not installed (pip install 'hfbert[deploy]')"
        return calls, theirs
    theirs.save_pretrained(os.path.join(work, "checkpoint"))
    path = export_onnx(Path(work, "checkpoint"), Path(work, "deberta.onnx"), token_type_ids=False)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    calls["onnxruntime"] = lambda batch: torch.from_numpy(
        session.run(None, {name: tensor.numpy() for name, tensor in batch.items()})[0]
    )
    return calls, theirs


def largest_differences(calls: dict, reference: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> dict:
    """name -> the largest absolute difference from transformers' last hidden state at real positions."""
    worst = dict.fromkeys(calls, 0.0)
    with torch.inference_mode():
        for batch in batches:
            real = batch["attention_mask"].bool()
            expected = reference(**batch).last_hidden_state[real]
            for name, call in calls.items():
                worst[name] = max(worst[name], float((call(batch)[real] - expected).abs().max()))
    return worst


def timed(call: Callable, batches: list[dict[str, torch.Tensor]]) -> float:
    with torch.inference_mode():
        started = time.perf_counter()
        for batch in batches:
            call(batch)
        return time.perf_counter() - started


def main() -> None:
    made = common.parser(__doc__, quick="32 texts and 3 rounds, for a check", threads=True)
    args = common.parse(made)
    torch.set_num_threads(args.threads)
    count, rounds = (32, 3) if args.quick else (96, 5)
    result = {"machine": common.machine(args.threads), "texts": count, "batch_size": BATCH_SIZE, "rounds": []}
    meter = BusyMeter()
    batches = mixed_batches(count)
    tokens = sum(int(batch["attention_mask"].sum()) for batch in batches)
    padded = sum(batch["input_ids"].numel() for batch in batches)
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as work:
        calls, reference = engines(work, args.threads, skipped)
        result["max_abs_difference"] = largest_differences(calls, reference, batches)  # also the warm-up
        names = list(calls)
        for index in range(rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            seconds = {name: timed(calls[name], batches) for name in order}
            result["rounds"].append(seconds)
            print(f"round {index + 1}: " + ", ".join(f"{name} {seconds[name]:.2f} s" for name in names), flush=True)
    result["skipped"] = skipped
    baseline = "transformers eager"
    result["speedup"] = {
        name: statistics.median(row[baseline] / row[name] for row in result["rounds"]) for name in names
    }
    result["median_seconds"] = {name: statistics.median(row[name] for row in result["rounds"]) for name in names}
    result["tokens"], result["padded_tokens"] = tokens, padded
    result["machine"]["load_after"] = os.getloadavg()[0]
    common.finish(result, meter)
    machine = result["machine"]
    print(
        f"\nDeBERTa-v3-base shape, {count} texts of {SHORTEST}-{LONGEST} tokens ({tokens} real, {padded} padded), "
        f"batches of {BATCH_SIZE}, {rounds} rounds; {machine['cpu']}, {args.threads} threads"
    )
    for name in names:
        median, speedup = result["median_seconds"][name], result["speedup"][name]
        difference = result["max_abs_difference"][name]
        print(
            f"  {name:28s} {median:7.2f} s   {tokens / median:8.0f} tokens/s   {speedup:5.2f}x transformers "
            f"(median of rounds)   max abs difference {difference:.1e}"
        )
    for name, why in skipped.items():
        print(f"  {name}: skipped, {why}")
    others = machine["others_cores"]
    busy = "unknown" if others is None else f"{others:.2f}"
    print(
        f"  load average {machine['load_before']:.2f} before, {machine['load_after']:.2f} after; other processes "
        f"kept {busy} cores busy"
    )
    common.write(args, None, result)


if __name__ == "__main__":
    main()
