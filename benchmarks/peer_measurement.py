"""benchmarks/peers.py's inputs (padding, the RoBERTa-family checkpoint, real texts) and measurement
(interleaved timing, agreement with transformers, the machine's bandwidth and GEMM rate, one workload row).
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import hfbert
from benchmarks import report
from benchmarks.benchmark import (  # the shared inputs and timing
    MIXED_BATCH,
    interleaved,
)
from benchmarks.peer_engines import Engine, progress
from benchmarks.report import HFBERT_ENGINES, PEERS
from hfbert.tools.parity import Accuracy
from hfbert.tools.parity.engines.reference import load_reference
from hfbert.tools.parity.engines.reference_adapters import exact_rotary

# Row 6's checkpoint: xlm-roberta-base's config.json but for the vocabulary (250002 there).
FAMILY_CONFIG = {
    "vocab_size": 30000,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
}


# -- inputs ----------------------------------------------------------------------------------------------------------
def pad(sequences: list[torch.Tensor], pad_id: int = 0, token_types: bool = True) -> dict[str, torch.Tensor]:
    """Token id sequences right-padded with `pad_id` to the longest, in benchmark.py's `batch` layout (without
    token_type_ids for a model that has none, with `token_types=False`)."""
    lengths = torch.tensor([len(sequence) for sequence in sequences])
    ids = torch.full((len(sequences), int(lengths.max())), pad_id, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = sequence
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    inputs = {"input_ids": ids, "attention_mask": mask}
    return {**inputs, "token_type_ids": torch.zeros_like(ids)} if token_types else inputs


def sorted_by_length(batches: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """The same sequences, longest first (sentence-transformers' order), re-batched by MIXED_BATCH."""
    sequences = [
        inputs["input_ids"][row, :length]
        for inputs in batches
        for row, length in enumerate(inputs["attention_mask"].sum(dim=1).tolist())
    ]
    sequences.sort(key=len, reverse=True)
    return [pad(sequences[start : start + MIXED_BATCH]) for start in range(0, len(sequences), MIXED_BATCH)]


def single_sequences(batches: list[dict[str, torch.Tensor]], config: hfbert.BertConfig) -> list[dict]:
    """Each sequence of `batches` alone (batch 1, no padding), its first and last ids made `config`'s bos and eos;
    benchmark.py's `batch` draws the others from 1000 up, clear of the RoBERTa family's special ids (pad 1 among
    them)."""
    sequences = []
    for inputs in batches:
        for row, length in enumerate(inputs["attention_mask"].sum(dim=1).tolist()):
            ids = inputs["input_ids"][row : row + 1, :length].clone()
            ids[0, 0], ids[0, -1] = config.bos_token_id, config.eos_token_id
            if int(ids.max()) >= config.vocab_size or bool((ids == config.pad_token_id).any()):
                raise ValueError(f"a drawn id is the pad id {config.pad_token_id} or past the vocabulary")
            ones = torch.ones_like(ids)
            sequences.append({"input_ids": ids, "attention_mask": ones, "token_type_ids": torch.zeros_like(ids)})
    return sequences


def write_family_checkpoint(directory: Path, seed: int = 0) -> Path:
    """transformers' XLMRobertaModel at xlm-roberta-base's shape (`FAMILY_CONFIG`: 12 layers of 768, 514 positions,
    pad id 1, one token type) with random weights (N(0, 0.02), LayerNorm gains 1, as benchmark.py's
    `make_checkpoint`), written by its save_pretrained, and a Unigram tokenizer of one made-up piece per vocabulary
    row in XLMRobertaTokenizerFast (CTranslate2's converter wants the two sizes equal). The vocabulary is 30000, not
    250002: batch 1 looks up one embedding row per token whatever the table's size, so the encoder's time is the
    same, and the file is 0.7 GB smaller."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if (directory / "model.safetensors").exists():
        return directory
    size = FAMILY_CONFIG["vocab_size"]
    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0 to 3, as xlm-roberta-base's; <mask> is the last id
    pieces = [*specials, *(f"\u2581w{index}" for index in range(size - len(specials) - 1)), "<mask>"]
    unigram = Tokenizer(models.Unigram([(piece, -1.0) for piece in pieces], unk_id=3, byte_fallback=False))
    unigram.pre_tokenizer, unigram.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    transformers.XLMRobertaTokenizerFast(tokenizer_object=unigram, model_max_length=512).save_pretrained(directory)
    model = transformers.XLMRobertaModel(transformers.XLMRobertaConfig(**FAMILY_CONFIG))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            gain = "LayerNorm" in name and name.endswith("weight")
            parameter.copy_(
                torch.ones_like(parameter) if gain else 0.02 * torch.randn(parameter.shape, generator=generator)
            )
    transformers.logging.disable_progress_bar()  # a bar for the one shard written, amid the progress lines
    model.save_pretrained(directory)
    return directory


def real_texts(count: int) -> list[str]:
    """Paragraphs of consecutive real sentences (hfbert's parity battery), 1 to 12 of them, log-normal around 2:
    from a few tokens to about 250, mixed as documents come."""
    from hfbert.tools.parity import default_texts

    sentences = default_texts()
    generator = torch.Generator().manual_seed(0)
    counts = torch.exp(math.log(2) + 0.8 * torch.randn(count, generator=generator)).round().clamp(1, 12).long()
    starts = torch.randint(0, len(sentences), (count,), generator=generator)
    return [
        " ".join(sentences[(start + offset) % len(sentences)] for offset in range(size))
        for start, size in zip(starts.tolist(), counts.tolist(), strict=True)
    ]


# -- measurement -----------------------------------------------------------------------------------------------------
# Untimed pause before each engine's turn: ONNX Runtime's, OpenVINO's and the OpenMP pools (torch's and
# CTranslate2's) keep spinning for a while after a call, on the cores the next engine needs.
SETTLE = 0.1


def time_engines(
    engines: dict[str, Engine], batches: list[dict], repeats: int, calls: int = 1, warm_up_all: bool = True
) -> dict[str, list[float]]:
    """Seconds per pass over `batches` (per call, for `calls` > 1) for each engine: benchmark.py's `interleaved`
    after a warm-up pass (or a warm-up call on the first batch). With `calls` > 1 each turn is that many calls, so
    what one engine leaves behind (a spinning worker pool) costs the next engine one call in `calls`, not each."""
    feeds = {name: [engine.prepare(inputs) for inputs in batches] for name, engine in engines.items()}

    def turn(engine: Engine, feed: list) -> Callable[[int], None]:
        def run(index: int) -> None:  # returns nothing: interleaved would keep every output otherwise
            for _ in range(calls):
                engine.run(feed[index])

        return run

    runners = {name: turn(engine, feeds[name]) for name, engine in engines.items()}
    if not warm_up_all:
        for runner in runners.values():
            runner(0)
    times, _ = interleaved(runners, list(range(len(batches))), repeats, 1 if warm_up_all else 0, "cpu", SETTLE)
    return {name: [seconds / calls for seconds in rounds] for name, rounds in times.items()}


def reference_outputs(checkpoint: Path, batches: list[dict]) -> dict[str, list[torch.Tensor]]:
    """transformers' encoder (AutoModel: BertModel, XLMRobertaModel ...; sdpa) on `batches` in fp32 (what the
    cosines compare with) and in float64 (the exact reference of the RMS errors; rotary positions in float64 too:
    `exact_rotary`), at the real tokens, each model loaded, run and freed before the engines are built."""
    import transformers

    transformers.logging.disable_progress_bar()  # a bar per model loaded, in the middle of the progress lines
    outputs = {}
    for name, dtype in (("fp32", torch.float32), ("float64", torch.float64)):
        model = load_reference(transformers, transformers.AutoModel, checkpoint, "sdpa", "cpu", dtype)
        if dtype == torch.float64:
            exact_rotary(model)
        outputs[name] = [real_tokens(model(**inputs).last_hidden_state, inputs) for inputs in batches]
        del model
        gc.collect()
    return outputs


def real_tokens(output: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """(tokens, hidden): what a model returns at pad positions is not defined."""
    return output[inputs["attention_mask"].bool()]


def check_outputs(engines: dict[str, Engine], batches: list[dict], references: dict) -> dict[str, dict]:
    """Each engine's accuracy on `batches` at the real tokens, by `hfbert parity`'s statistics (`Accuracy`): its
    smallest cosine to transformers fp32, its RMS error against transformers float64, and that error over
    transformers fp32's own (the `rms_ratio`)."""
    accuracy, theirs = {}, math.nan
    for name, engine in engines.items():
        record = Accuracy(torch.float32)
        for inputs, fp32, exact in zip(batches, references["fp32"], references["float64"], strict=True):
            record.update(real_tokens(engine.run(engine.prepare(inputs)), inputs), fp32, exact)
        theirs = record.reference_error.rms
        accuracy[name] = {
            "min_cosine": record.versus_transformers.min_cosine,
            "rms_error": record.ours_error.rms,
            "rms_ratio": record.ratio,
        }
    return {"transformers_fp32_rms_error": theirs, "engines": accuracy}


def read_bandwidth(tries: int = 5) -> float:
    """Bytes per second that summing a 1 GiB float32 tensor streams (best of `tries`, torch's threads)."""
    big = torch.ones(2**28)  # 1 GiB: far beyond every cache level
    best = math.inf
    for _ in range(tries):
        start = time.perf_counter()
        big.sum()
        best = min(best, time.perf_counter() - start)
    return big.numel() * big.element_size() / best


def gemm_rate(n: int = 2048, tries: int = 5) -> dict[str, Any]:
    """The best rate torch.mm reaches on n x n fp32 matrices here (best of `tries` after one warm-up, torch's
    threads): the ceiling against which the dense rows' useful GFLOP/s are shown."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = math.inf
    for _ in range(tries):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return {"n": n, "dtype": "float32", "threads": torch.get_num_threads(), "gflops": 2 * n**3 / best / 1e9}


def encoder_weight_bytes(config: hfbert.BertConfig, bytes_per_weight: int) -> int:
    """The encoder layers' Linear weights (query, key, value, output, intermediate, output): what batch 1 streams."""
    hidden, intermediate = config.hidden_size, config.intermediate_size
    return config.num_hidden_layers * (4 * hidden * hidden + 2 * hidden * intermediate) * bytes_per_weight


def workload_row(
    key: str,
    label: str,
    engines: dict[str, Engine],
    batches: list[dict],
    repeats: int,
    calls: int,
    args: argparse.Namespace,
    per_batch: bool = False,
) -> dict:
    """One timed row; `per_batch`: a pass's time divided by its batches (row 6's calls of batch 1)."""
    progress(f"{label}: {', '.join(engines)}")
    # --quick warms a mixed-length row up on its first batch only: a whole warm-up pass would triple its cost.
    rounds = time_engines(engines, batches, repeats, calls, warm_up_all=not args.quick or len(batches) == 1)
    if per_batch:
        rounds = {name: [value / len(batches) for value in values] for name, values in rounds.items()}
    seconds = {name: statistics.median(values) for name, values in rounds.items()}
    row = {"row": key, "label": label, "seconds": seconds, "rounds": rounds, "calls_per_round": calls}
    ours = {name: seconds[name] for name in HFBERT_ENGINES if name in seconds}
    if ours:  # every ratio is against hfbert's fastest engine in this row (hfbert or hfbert fast, say)
        best = min(ours, key=ours.get)
        row["hfbert_fastest"] = best
        row["ratio"] = {name: value / seconds[best] for name, value in seconds.items()}
        peers = {name: seconds[name] for name in PEERS if name in seconds}
        if peers:
            fastest = min(peers, key=peers.get)
            row["fastest_peer"], row["hfbert_vs_fastest_peer"] = fastest, peers[fastest] / seconds[best]
            row["goal"] = report.peer_goal(key)
    progress(f"{label}: " + ", ".join(f"{name} {report.show_seconds(value)}" for name, value in seconds.items()))
    if "hfbert_vs_fastest_peer" in row:
        ratio, goal = row["hfbert_vs_fastest_peer"], row["goal"]
        progress(
            f"{label}: goal {row['hfbert_fastest']} >= {goal:.2f}x {row['fastest_peer']}: {ratio:.2f}x, "
            + ("met" if ratio >= goal else "MISS")
        )
    return row
