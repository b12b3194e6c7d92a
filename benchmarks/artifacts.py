"""Deployment artifacts of a BERT, RoBERTa-family or MPNet checkpoint, built with the engines' own tools:
transformers' encoder for config.json's model_type (BertModel, RobertaModel, XLMRobertaModel, MPNetModel ...)
exported by torch.onnx.export, ONNX Runtime's transformers optimizer (with or without GELU approximation), its
dynamic int8 quantization, OpenVINO's convert_model + save_model, CTranslate2's TransformersConverter.
benchmarks/peers.py times them; benchmarks/certify.py and tests/test_parity_artifacts.py judge them with
`hfbert parity --artifact`."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import torch

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# Encoders whose transformers class has no pooler (and no add_pooling_layer).
WITHOUT_POOLER = ("modernbert", "electra", "distilbert", "deberta-v2")


class Exporter(torch.nn.Module):
    """transformers' encoder with the inputs as positional arguments, for torch.onnx.export: last_hidden_state,
    and pooler_output with `pooler`; with `token_type_ids=False` the graph takes no token types (a model fed none:
    BERT's then embeds type 0, MPNet's forward has no such argument)."""

    def __init__(self, model: torch.nn.Module, token_type_ids: bool = True, pooler: bool = False) -> None:
        super().__init__()
        self.model, self.token_type_ids, self.pooler = model, token_type_ids, pooler

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        types = {"token_type_ids": token_type_ids} if self.token_type_ids else {}
        output = self.model(input_ids, attention_mask=attention_mask, **types)
        return (output.last_hidden_state, output.pooler_output) if self.pooler else output.last_hidden_state


def export_onnx(
    checkpoint: Path,
    path: Path,
    token_type_ids: bool = True,
    pooler: bool = False,
    dynamic: bool = True,
    attn_implementation: str = "eager",
) -> Path:
    """transformers' encoder for config.json's model_type (eager attention by default: the graph ORT's BERT fusions
    recognise) as ONNX, opset 17, dynamic batch and sequence axes (`dynamic=False`: fixed at the example's 2 x 16, as
    an export that names no axes). The graph takes token_type_ids only where the model has more than one token type
    (not the RoBERTa family's: input_ids and attention_mask, its positions computed in the graph from input_ids, as
    optimum exports it; MPNet's the same, the relative-position bias computed in the graph from the sequence length;
    ModernBERT's the same, its rotary positions and sliding-window mask computed in the graph; its class has no
    pooler, so `pooler` stays False). `attn_implementation`: the attention transformers runs while it is traced
    ("sdpa" is exported as MatMul, Softmax, MatMul: benchmarks/peer_modernbert.py's row)."""
    import transformers

    transformers.logging.set_verbosity_error()  # its load report lists the heads the encoder leaves out
    model_type = json.loads((Path(checkpoint) / "config.json").read_text()).get("model_type")
    options = {} if model_type in WITHOUT_POOLER else {"add_pooling_layer": pooler}
    model = transformers.AutoModel.from_pretrained(
        checkpoint, attn_implementation=attn_implementation, **options
    ).eval()
    generator = torch.Generator().manual_seed(0)
    config = model.config
    vocabulary = config.vocab_size
    ids = torch.randint(min(1000, vocabulary // 2), vocabulary, (2, 16), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0  # one padded row, so the mask arithmetic is traced as such
    ids[1, 12:] = config.pad_token_id or 0
    example = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    token_type_ids = token_type_ids and getattr(config, "type_vocab_size", 0) > 1  # MPNet's config has no such field
    names = list(INPUT_NAMES if token_type_ids else INPUT_NAMES[:2])
    outputs = ["last_hidden_state", "pooler_output"] if pooler else ["last_hidden_state"]
    axes = {name: {0: "batch", 1: "sequence"} for name in (*names, "last_hidden_state")}
    if pooler:
        axes["pooler_output"] = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings about the TorchScript exporter
        torch.onnx.export(
            Exporter(model, token_type_ids, pooler).eval(),
            tuple(example[name] for name in names),
            path,
            input_names=names,
            output_names=outputs,
            dynamic_axes=axes if dynamic else None,
            opset_version=17,
            dynamo=False,
        )
    return path


class HeadExporter(torch.nn.Module):
    """transformers' model with a task head, its inputs positional, returning the head's logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


def export_head_onnx(checkpoint: Path, path: Path, task: str) -> Path:
    """transformers' BERT with its `task` head ("sequence-classification": BertForSequenceClassification's logits;
    "masked-lm": BertForMaskedLM's logits over the vocabulary, as optimum's ORTModelFor* run them) as ONNX, opset
    17, eager attention (the graph ORT's BERT fusions recognise), dynamic batch and sequence axes, output "logits"."""
    import transformers

    classes = {"sequence-classification": "AutoModelForSequenceClassification", "masked-lm": "AutoModelForMaskedLM"}
    transformers.logging.set_verbosity_error()
    model = getattr(transformers, classes[task]).from_pretrained(checkpoint, attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, model.config.vocab_size, (2, 16), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    axes = {name: {0: "batch", 1: "sequence"} for name in (*INPUT_NAMES, "logits")}
    if task == "sequence-classification":
        axes["logits"] = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            HeadExporter(model).eval(),
            (ids, mask, torch.zeros_like(ids)),
            path,
            input_names=list(INPUT_NAMES),
            output_names=["logits"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    return path


def fuse_onnx(
    plain: Path, path: Path, num_heads: int, hidden_size: int, gelu_approximation: bool = False
) -> tuple[Path, dict[str, int]]:
    """ONNX Runtime's transformers optimizer (model_type "bert"): fused attention, layer norms, GELU. On a
    RoBERTa-family graph it fuses the same but for the embeddings: a LayerNormalization, not EmbedLayerNormalization
    (whose pattern has no positions computed from the ids). Its Attention nodes read the mask as each row's length
    (ORT's default mask format): right padding only, where the unfused RoBERTa-family graph also takes left. With
    `gelu_approximation`, GELU replaced by FastGelu (its tanh approximation), as its O3 level does."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_gelu_approximation = gelu_approximation
    fused = optimize_model(
        str(plain), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, optimization_options=options
    )
    fused.save_model_to_file(str(path))
    return path, {name: count for name, count in fused.get_fused_operator_statistics().items() if count}


def quantize_onnx(fused: Path, path: Path) -> Path:
    """ONNX Runtime's quantize_dynamic: int8 weights per channel, uint8 activations quantized at run time."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_dynamic logs a "consider pre-processing" warning meant for CNNs
    try:
        quantize_dynamic(
            fused,
            path,
            weight_type=QuantType.QInt8,
            per_channel=True,  # min cosine to fp32 0.99962 against 0.99945 per tensor, at the same speed
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},  # fused ops carry no inferred types
        )
    finally:
        root.setLevel(level)
    return path


def convert_openvino(onnx_file: Path, path: Path) -> Path:
    """OpenVINO's convert_model of an ONNX export, saved as IR (`.xml` + `.bin`) with f32 weights."""
    import openvino

    openvino.save_model(openvino.convert_model(str(onnx_file)), str(path), compress_to_fp16=False)
    return path


def convert_ctranslate2(checkpoint: Path, work: Path, quantization: str | None = None) -> Path:
    """CTranslate2's TransformersConverter (`quantization`: None keeps float32, "int8" ...). Its config is copied
    with position_embedding_type "absolute" when absent: the converter asserts it, transformers 5's BertConfig no
    longer defines it; the weights are linked, not copied."""
    from hfbert.tools.parity.engines.ctranslate2_engine import import_ctranslate2

    import_ctranslate2()  # the first import of it decides which OpenMP runtime it binds to: see there
    import ctranslate2.converters

    suffix = f"-{quantization}" if quantization else ""
    source, target = work / f"ctranslate2-source{suffix}", work / f"ctranslate2{suffix}"
    source.mkdir()
    for file in checkpoint.iterdir():
        if file.name != "config.json" and file.is_file():
            (source / file.name).symlink_to(file.resolve())
    config = json.loads((checkpoint / "config.json").read_text())
    config.setdefault("position_embedding_type", "absolute")
    (source / "config.json").write_text(json.dumps(config))
    ctranslate2.converters.TransformersConverter(str(source)).convert(
        str(target), quantization=quantization, force=True
    )
    return target
