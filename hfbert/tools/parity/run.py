"""`run_parity`: load hfbert and transformers once, run the battery, return the report."""

from __future__ import annotations

import gc
import importlib.metadata
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from converters.dtypes import DTYPES
from hfbert.modeling.attention import ATTENTION_IMPLEMENTATIONS
from hfbert.tools.extras import import_transformers
from hfbert.tools.parity.artifact_paths import resolve_artifact
from hfbert.tools.parity.artifacts import ArtifactCheck
from hfbert.tools.parity.cases import build_cases, default_texts
from hfbert.tools.parity.compare import _compare_batch
from hfbert.tools.parity.engines import hfbert_engine, open_artifact, transformers_engine
from hfbert.tools.parity.reference import _no_tf32, position_offset
from hfbert.tools.parity.report import ParityReport
from hfbert.tools.parity.sentences import CASE as SENTENCE_CASE
from hfbert.tools.parity.sentences import SentenceStats, embed, read_sentence_pipeline
from hfbert.tools.parity.statistics import ACCURACY_RATIO, TOP_K, Accuracy, Row, TopKStats

# hfbert's linear layers as built (`nn.Linear`), or swapped by `hfbert.optimize_for_inference`: "packed" (its
# default, precision "highest": judged by ACCURACY_RATIO) or "fast" (precision "high": judged by its own bound).
LINEAR_KERNELS = (None, "standard", "packed", "fast")


def _describe_files(files: list[Path]) -> list[dict[str, Any]]:
    from converters.hub import sha256_of

    return [{"name": file.name, "bytes": file.stat().st_size, "sha256": sha256_of(file)} for file in files]


def fast_mode_bound() -> float:
    """The bound of `optimize_for_inference(model, precision="high")` (hfbert.inference.ACCURACY_BOUNDS["high"])."""
    from hfbert.inference import ACCURACY_BOUNDS

    return float(ACCURACY_BOUNDS["high"])


def run_parity(
    model_path: str | os.PathLike,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    attn: str = "sdpa",
    texts: Sequence[str] | None = None,
    batch_size: int = 8,
    *,
    revision: str | None = None,
    reference: str | os.PathLike | None = None,
    linear_kernel: str | None = None,
    tolerance: float | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    model_name: str | None = None,
    artifacts: Sequence[str | os.PathLike] = (),
    artifact_bound: float = ACCURACY_RATIO,
    artifact_precision: str = "f32",
    artifact_names: Sequence[str] | None = None,
    ignore_auto_map: bool = False,
) -> ParityReport:
    """Compare hfbert with transformers, and both with transformers in float64, on `model_path` (a local
    directory or a Hub repo id); see the module docstring for what runs, what is compared and when it passes.
    `reference`: load transformers from this checkpoint instead (default: `model_path`), e.g. to check a
    converted or re-saved copy against its original. `linear_kernel`: "standard" (default: `nn.Linear`, as built),
    "packed" (hfbert's model through `hfbert.optimize_for_inference`, judged by the same 1.5x) or "fast" (through
    `optimize_for_inference(model, precision="high")`, judged by that mode's bound, 3x). `tolerance`: also require
    max abs against transformers to be at most this. `cache_dir`, `token`: for Hub repo ids, as in huggingface_hub.
    `model_name`: what the report calls the model (default: `model_path` as given). `artifacts`: deployed
    artifacts judged on the same batches against the same float64 run (a .onnx file, an OpenVINO .xml, a CTranslate2
    folder; a relative path not found here is looked up inside the model, on the Hub for a repo id), each output
    within `artifact_bound` x transformers' fp32 error; `artifact_precision`: OpenVINO's precision hint ("f32", or
    "default": the CPU's own choice). `artifact_names`: what the report calls them (default: as given).
    A checkpoint whose config.json maps the model to custom code (`auto_map`) is refused before anything loads, as
    `from_pretrained` refuses it, unless `ignore_auto_map=True` says its weights are plain BERT."""
    transformers = import_transformers()
    from converters.checkpoint_files import read_checkpoint
    from converters.hub import CONFIG_FILE, resolve_checkpoint
    from converters.key_map import MLM_HEAD, head_of, normalize_name
    from converters.loading import check_auto_map
    from hfbert.modeling.config import BertConfig
    from hfbert.modeling.tokenizer import BertTokenizer
    from hfbert.platform.cpu import cpu_name, instruction_set
    from hfbert.platform.mkl import mkl_branch

    started = time.perf_counter()
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    dtype_name = next(name for name, value in DTYPES.items() if value == dtype)
    if attn not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attn must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, not {attn!r}")
    if linear_kernel not in LINEAR_KERNELS:
        raise ValueError(f"linear_kernel must be one of {', '.join(map(str, LINEAR_KERNELS))}, not {linear_kernel!r}")
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    if tolerance is not None and not tolerance >= 0:
        raise ValueError(f"tolerance must be a number >= 0, got {tolerance}")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine")
    if torch.device(device).type == "mps":
        raise ValueError(f"device {device!r}: the float64 reference cannot run on mps (it has no float64); use cpu")
    if not artifact_bound > 0:
        raise ValueError(f"artifact bound must be a number > 0, got {artifact_bound}")
    if artifacts and torch.device(device).type != "cpu":
        raise ValueError(f"device {device!r}: deployed artifacts run on the CPU; run with --device cpu")
    if artifacts and dtype != torch.float32:
        raise ValueError(f"dtype {dtype_name}: artifacts are judged against transformers' fp32 error; use float32")
    precision = "high" if linear_kernel == "fast" else "highest"
    bound = fast_mode_bound() if linear_kernel == "fast" else ACCURACY_RATIO

    hub = {"cache_dir": cache_dir, "token": token}
    include = {"include_sentence_transformers": True} if artifacts else {}
    directory = Path(resolve_checkpoint(model_path, revision, include_tokenizer=True, **hub, **include))
    checkpoint = read_checkpoint(directory)
    stored = {normalize_name(name) for name in checkpoint.tensors}
    has_pooler = any(name.startswith("pooler.") for name in stored)
    has_mlm_head = any(head_of(name) == MLM_HEAD for name in stored)
    weight_files = _describe_files(checkpoint.files)
    del checkpoint
    reference_directory = Path(resolve_checkpoint(reference, **hub)) if reference is not None else directory
    reference_files = _describe_files(read_checkpoint(reference_directory).files) if reference is not None else []
    if reference is not None:  # checked as hfbert checks a config (naming the file), before transformers reads it
        BertConfig.from_json_file(reference_directory / CONFIG_FILE)

    # The artifacts first: one that cannot run fails before the models load.
    our_config = BertConfig.from_pretrained(directory)
    if not ignore_auto_map:
        check_auto_map(our_config.to_dict().get("auto_map"), str(directory / CONFIG_FILE))
    hidden_size = our_config.hidden_size
    checks = [
        ArtifactCheck(
            str(name),
            open_artifact(
                resolve_artifact(artifact, model_path, directory, **hub),
                hidden_size,
                torch.get_num_threads(),
                artifact_precision,
            ),
            artifact_bound,
            instruction_set=instruction_set(),
            vnni=has_vnni(),
        )
        for name, artifact in zip(artifact_names or artifacts, artifacts, strict=True)
    ]
    # One model per library, loaded once: the masked-LM model when the checkpoint has that head (its backbone gives
    # the hidden states, the pooler and the attention probabilities), else the backbone alone.
    tokenizer = BertTokenizer.from_pretrained(directory)
    shape = {"has_mlm_head": has_mlm_head, "has_pooler": has_pooler, "dtype": dtype, "device": device, "attn": attn}
    ours, ran_kernel = hfbert_engine.load(
        directory, linear_kernel=linear_kernel, ignore_auto_map=ignore_auto_map, **shape
    )
    theirs, exact = transformers_engine.load(transformers, reference_directory, **shape)
    config = ours.model.config
    cases = build_cases(
        tokenizer, list(texts or default_texts()), batch_size, config.max_position_embeddings, config.type_vocab_size
    )
    for check in checks:
        check.untested = {case.name: case.note for case in cases if not case.exercised}

    def accuracy() -> Accuracy:
        return Accuracy(dtype, tolerance, bound=bound)

    layers = config.num_hidden_layers
    attention_note = "eager pass" if attn == "sdpa" else ""
    rows = {"embeddings": Row("embeddings", 0, accuracy)}
    rows.update({f"layer {i}": Row(f"layer {i}", 2 * i + 2, accuracy) for i in range(layers)})
    if has_pooler:
        rows["pooler"] = Row("pooler", 2 * layers + 1, accuracy)
    for i in range(layers):
        rows[f"attentions layer {i}"] = Row(f"attentions layer {i}", 2 * i + 1, accuracy, note=attention_note)
    if has_mlm_head:
        rows["mlm logits"] = Row("mlm logits", 2 * layers + 2, accuracy)
        rows[f"mlm top-{TOP_K}"] = Row(f"mlm top-{TOP_K}", 2 * layers + 3, TopKStats)

    runners = (ours, theirs, exact)
    pipeline = read_sentence_pipeline(directory, config, tokenizer.model_max_length) if checks else None
    baseline = SentenceStats()
    from hfbert.tools.progress import Progress

    if torch.device(device).type == "cpu":
        # Freed memory kept for the next batch, process-wide (hfbert.platform.allocator): without it, every cast of
        # the float64 reference's weights and every large output faults its pages in anew (3x slower).
        from hfbert.platform.allocator import keep_freed_memory

        keep_freed_memory()
    with _no_tf32(torch.device(device).type == "cuda"), torch.no_grad():
        # A bar on a terminal, a line every 30 s in a log (hfbert.tools.progress).
        bar = Progress(sum(len(case.batches) for case in cases), "parity", "batch", enabled=progress)
        for case in cases:
            bar.set_postfix_str(case.name)
            for index, batch in enumerate(case.batches):
                batch = {key: value.to(device) for key, value in batch.items()}
                kept = _compare_batch(case.name, batch, runners, rows, dtype, bound, attentions=attn == "eager")
                texts_once = index < len(case.batches) - case.added  # an added batch repeats texts: no sentences
                for check in checks:
                    check.update(case.name, batch, *kept, pipeline if texts_once else None)
                if checks and pipeline is not None and case.name == SENTENCE_CASE and texts_once:
                    mask = batch["attention_mask"]
                    baseline.add(*(embed(pipeline, named["last_hidden_state"], mask) for named in kept))
                del kept
                bar.update()
        bar.close()
        probe = next((case.batches[0] for case in cases if case.name == SENTENCE_CASE), None)
        for check in checks:
            row = check.rows.get("last_hidden_state")
            if probe is not None and row is not None and not row.passed and check.error is None:
                check.position_offset = position_offset(check.engine.run, exact, probe, config.max_position_embeddings)
    del runners, ours, theirs, exact
    gc.collect()

    return ParityReport(
        model=str(model_name if model_name is not None else model_path),
        model_path=str(directory),
        reference_path=str(reference_directory),
        device=str(device),
        dtype=dtype_name,
        attn=attn,
        linear_kernel=ran_kernel,
        instruction_set=instruction_set(),
        tolerance=tolerance,
        num_layers=layers,
        versions={
            "hfbert": _installed_version("hfbert"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "device_name": torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else cpu_name(),
            "mkl": mkl_branch(),
        },
        weight_files=weight_files,
        reference_weight_files=reference_files,
        cases=[case.describe() for case in cases],
        rows=list(rows.values()),
        seconds=round(time.perf_counter() - started, 3),
        accuracy_bound=bound,
        precision=precision,
        artifacts=checks,
        sentence_pipeline=pipeline.describe() if pipeline is not None else "",
        sentence_baseline=baseline.numbers(),
    )


def has_vnni() -> bool:
    """Whether the CPU multiplies u8 x s8 with VNNI (AVX512_VNNI or AVX_VNNI): without it, the products of
    dynamically quantized int8 graphs saturate in 16 bits."""
    from hfbert.platform.cpu import cpu_flags

    flags = cpu_flags()
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
