"""Parity with transformers: run a checkpoint in hfbert and in `transformers` side by side, output by output.

    >>> from hfbert.parity import run_parity
    >>> report = run_parity("google-bert/bert-base-uncased")  # doctest: +SKIP
    >>> print(report.table()); report.passed  # doctest: +SKIP

What runs: a fixed battery of real sentences (`hfbert/data/parity_sentences.txt`, or your own), tokenized with
the checkpoint's tokenizer (`hfbert.BertTokenizer`), as five cases:

- "single": every text alone (batch of one, no padding);
- "pairs": consecutive texts as two segments (token_type_ids 0 / 1), batched and padded right (skipped when the
  model has a single token type);
- "right padding" and "left padding": the texts in batches of `batch_size`; with left padding both models get
  `position_ids = cumsum(attention_mask) - 1` (clamped at 0), so real tokens start at position 0 in both;
- "max length": one sequence exactly `max_position_embeddings` tokens long (the texts repeated, truncated).

What is compared, over real (non-pad) positions only: the embeddings output and every layer's hidden state, the
pooler (when the checkpoint has one), the attention probabilities of every layer (rows of real query tokens),
and, when the checkpoint has a masked-LM head (`cls.predictions.*`), the MLM logits and the top-5 token ids at
every real position. Attention probabilities exist only in the eager implementation: with `attn="sdpa"` the
hidden states, pooler and logits come from the sdpa models and the attention rows from an extra eager pass of
both models over the same batches (marked "eager pass" in the table).

Numbers per output, over all cases: max abs = max |a - b|; max rel = max over token vectors of
||a - b|| / ||b|| (L2); mean abs = mean |a - b|; min cos = smallest cosine similarity of a token vector (an
attention row per head, a pooler vector per sequence) with transformers'. An output passes when max abs is at
most the tolerance: fp32 on CPU 1e-5; fp32 on CUDA 1e-4 (TF32 switched off for the run); fp16 / bf16 1e-2,
against transformers in the same dtype. Top-5 passes when, at every position, the two models' top-5 ids are
identical, or differ only among tokens whose reference logits are tied within that tolerance.

transformers is the reference, not a dependency: it is imported only inside these functions
(`pip install 'hfbert[parity]'`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOP_K = 5
INSTALL_PARITY = "pip install 'hfbert[parity]'"


class MissingExtraError(ImportError):
    """An optional dependency (transformers, matplotlib, numpy) is not installed; the message says how to get it."""


def tolerance_for(device: str, dtype: torch.dtype) -> float:
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2
    return 1e-4 if torch.device(device).type == "cuda" else 1e-5


def default_texts() -> list[str]:
    """The shipped battery: about 40 varied real English sentences."""
    text = resources.files("hfbert").joinpath("data", "parity_sentences.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def read_texts(path: str | os.PathLike) -> list[str]:
    """One text per line; blank lines are skipped."""
    texts = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"{path}: no text in the file (expected one text per line)")
    return texts


def import_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise MissingExtraError(
            f"the parity check compares against transformers, which is not installed: {INSTALL_PARITY}"
        ) from None
    return transformers


# -- statistics -----------------------------------------------------------------------------------------------


def _worse(current: float, value: float) -> float:
    """The larger of two errors, where NaN (a model produced NaN or inf) is the worst of all."""
    return value if math.isnan(value) or value > current else current


@dataclass
class Stats:
    """Differences between two sets of vectors, accumulated over batches."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    sum_abs: float = 0.0
    elements: int = 0
    vectors: int = 0
    min_cosine: float = 1.0

    def update(self, ours: Tensor, reference: Tensor) -> None:
        """`ours` and `reference`: (vectors, ...) of the same shape; each row is one token (or sequence) vector."""
        if ours.shape != reference.shape:
            raise ValueError(f"shape {tuple(ours.shape)} in hfbert but {tuple(reference.shape)} in transformers")
        ours, reference = ours.flatten(1), reference.flatten(1)
        rows = max(1, 2**22 // max(1, ours.shape[1]))  # float64 in slices of ~32 MB (MLM logits are large)
        for start in range(0, ours.shape[0], rows):
            a, b = ours[start : start + rows].double(), reference[start : start + rows].double()
            difference = (a - b).abs()
            self.max_abs = _worse(self.max_abs, float(difference.max()))
            self.sum_abs += float(difference.sum())
            self.elements += difference.numel()
            self.vectors += a.shape[0]
            relative = (a - b).norm(dim=1) / b.norm(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
            self.max_rel = _worse(self.max_rel, float(relative.max()))
            cosine = float(F.cosine_similarity(a, b, dim=1, eps=1e-300).min().clamp(max=1.0))
            self.min_cosine = cosine if math.isnan(cosine) or cosine < self.min_cosine else self.min_cosine

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / self.elements if self.elements else 0.0


@dataclass
class TopKStats:
    """Agreement of the top-k token ids at each position."""

    positions: int = 0
    identical: int = 0
    near_ties: int = 0  # ids differ, but only among tokens whose reference logits are tied within the tolerance

    def update(self, ours: Tensor, reference: Tensor, tolerance: float, k: int = TOP_K) -> None:
        ours_ids = ours.topk(k, dim=-1).indices
        reference_values, reference_ids = reference.topk(k, dim=-1)
        identical = (ours_ids == reference_ids).all(-1)
        # Our ids, scored by the reference: as good as the reference's own top-k, rank by rank, up to the tolerance?
        tied = (reference.gather(-1, ours_ids).float() - reference_values.float()).abs() <= tolerance
        self.positions += ours_ids.shape[0]
        self.identical += int(identical.sum())
        self.near_ties += int((~identical & tied.all(-1)).sum())

    @property
    def disagreements(self) -> int:
        return self.positions - self.identical - self.near_ties


@dataclass
class Row:
    """One compared output: its numbers over all cases, and per case."""

    name: str
    order: int  # position in the forward pass; the first failing row in this order is the first divergence
    tolerance: float
    stats: Stats | TopKStats
    by_case: dict[str, Stats | TopKStats] = field(default_factory=dict)
    note: str = ""

    @property
    def passed(self) -> bool:
        if isinstance(self.stats, TopKStats):
            return self.stats.disagreements == 0
        return self.stats.max_abs <= self.tolerance  # False for NaN

    def update(self, case: str, ours: Tensor, reference: Tensor) -> None:
        if isinstance(self.stats, TopKStats):
            self.stats.update(ours, reference, self.tolerance)
            self.by_case.setdefault(case, TopKStats()).update(ours, reference, self.tolerance)
        else:
            self.stats.update(ours, reference)
            self.by_case.setdefault(case, Stats()).update(ours, reference)

    def to_dict(self) -> dict[str, Any]:
        def numbers(stats: Stats | TopKStats) -> dict[str, Any]:
            values = asdict(stats)
            values["mean_abs" if isinstance(stats, Stats) else "disagreements"] = (
                stats.mean_abs if isinstance(stats, Stats) else stats.disagreements
            )
            return values

        return {
            "name": self.name,
            "passed": self.passed,
            "tolerance": self.tolerance,
            "note": self.note,
            **numbers(self.stats),
            "by_case": {case: numbers(stats) for case, stats in self.by_case.items()},
        }


# -- the report -----------------------------------------------------------------------------------------------


@dataclass
class ParityReport:
    model: str
    model_path: str
    reference_path: str  # where transformers loaded from: model_path unless a reference was given
    device: str
    dtype: str
    attn: str
    linear_kernel: str  # what hfbert's linear layers ran on: "oneDNN" or "F.linear" (transformers' kernel)
    tolerance: float
    num_layers: int
    versions: dict[str, str]
    weight_files: list[dict[str, Any]]
    cases: list[dict[str, Any]]
    rows: list[Row]
    reference_weight_files: list[dict[str, Any]] = field(default_factory=list)  # only with a separate reference
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    @property
    def first_divergence(self) -> str | None:
        """The first output, in forward order, that exceeds the tolerance (None when all pass)."""
        failing = [row for row in self.rows if not row.passed]
        return min(failing, key=lambda row: row.order).name if failing else None

    def table(self) -> str:
        tokens = sum(case["real_tokens"] for case in self.cases)
        described = ", ".join(f"{case['name']} {case['sequences']}" for case in self.cases)
        lines = [f"model      {self.model_path}"]
        if self.reference_path != self.model_path:
            lines.append(f"reference  {self.reference_path} (loaded in transformers)")
        lines += [
            f"run        {self.device}, {self.dtype}, attention {self.attn}, linear {self.linear_kernel}; "
            f"hfbert {self.versions['hfbert']}, transformers {self.versions['transformers']}, "
            f"torch {self.versions['torch']}",
            f"inputs     {described} sequences; {tokens} real tokens compared per output",
            "",
            f"{'output':<28} {'max abs':>10} {'max rel':>10} {'mean abs':>10} {'min cos':>11}  "
            f"result (tolerance {self.tolerance:g})",
        ]
        for row in self.rows:
            if isinstance(row.stats, TopKStats):
                s = row.stats
                numbers = f"{s.identical}/{s.positions} positions identical, {s.near_ties} near ties"
                lines.append(f"{row.name:<28} {numbers:<54} {'pass' if row.passed else 'FAIL'}")
                continue
            s = row.stats
            verdict = "pass" if row.passed else "FAIL"
            note = f"  ({row.note})" if row.note else ""
            lines.append(
                f"{row.name:<28} {s.max_abs:>10.3e} {s.max_rel:>10.3e} {s.mean_abs:>10.3e} {s.min_cosine:>11.8f}  "
                f"{verdict}{note}"
            )
        lines.append("")
        first = self.first_divergence
        if first is None:
            lines.append(f"all {len(self.rows)} outputs match transformers within {self.tolerance:g}")
        else:
            failed = sum(not row.passed for row in self.rows)
            lines.append(f"{failed} of {len(self.rows)} outputs exceed {self.tolerance:g}; first divergence: {first}")
            row = next(row for row in self.rows if row.name == first)
            cases = [case for case, stats in row.by_case.items() if not Row(case, 0, row.tolerance, stats).passed]
            lines.append(f"           in the cases: {', '.join(cases)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "first_divergence": self.first_divergence,
            "model": self.model,
            "model_path": self.model_path,
            "reference_path": self.reference_path,
            "device": self.device,
            "dtype": self.dtype,
            "attn": self.attn,
            "linear_kernel": self.linear_kernel,
            "tolerance": self.tolerance,
            "num_layers": self.num_layers,
            "versions": self.versions,
            "weight_files": self.weight_files,
            "reference_weight_files": self.reference_weight_files,
            "cases": self.cases,
            "seconds": self.seconds,
            "definitions": {
                "max_abs": "max |a - b| over real positions",
                "max_rel": "max over token vectors of ||a - b|| / ||b|| (L2)",
                "mean_abs": "mean |a - b| over real positions",
                "min_cosine": "min cosine similarity of a token vector (attention: a row per head; pooler: a sequence)",
                "passed": "max_abs <= tolerance; top-5: every position identical or a near tie",
            },
            "rows": [row.to_dict() for row in self.rows],
        }

    def write_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    def plot(self, path: str | os.PathLike) -> None:
        """Max and mean abs error per layer, log scale, one line per output kind; the tolerance dashed."""
        pyplot = import_pyplot()
        floor = 1e-12  # exact agreement (0) is drawn here
        hidden = [row for row in self.rows if row.name == "embeddings" or row.name.startswith("layer ")]
        attentions = [row for row in self.rows if row.name.startswith("attentions")]
        extra = [row for row in self.rows if row.name in ("pooler", "mlm logits")]
        figure, axes = pyplot.subplots(figsize=(9, 4.5))
        x_hidden = list(range(-1, len(hidden) - 1))  # embeddings at -1, layer i at i
        for key, style in (("max_abs", "o-"), ("mean_abs", "o:")):
            values = [max(getattr(row.stats, key), floor) for row in hidden]
            axes.plot(x_hidden, values, style, label=f"hidden states, {key.replace('_', ' ')}")
        if attentions:
            values = [max(row.stats.max_abs, floor) for row in attentions]
            axes.plot(range(len(attentions)), values, "s-", label="attention probabilities, max abs")
        for offset, row in enumerate(extra):
            axes.plot([self.num_layers + offset], [max(row.stats.max_abs, floor)], "D", label=f"{row.name}, max abs")
        axes.axhline(self.tolerance, color="red", linestyle="--", label=f"tolerance {self.tolerance:g}")
        ticks = x_hidden + [self.num_layers + offset for offset in range(len(extra))]
        axes.set_xticks(ticks, ["emb"] + [str(i) for i in range(self.num_layers)] + [row.name for row in extra])
        axes.set_yscale("log")
        axes.set_xlabel("layer")
        axes.set_ylabel(f"error vs transformers (0 drawn at {floor:g})")
        axes.set_title(
            f"hfbert vs transformers: {Path(self.model_path).name}, {self.device}, {self.dtype}, attention {self.attn}"
        )
        axes.legend(fontsize="small")
        figure.tight_layout()
        figure.savefig(path, dpi=120)
        pyplot.close(figure)


def import_pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError("--plot needs matplotlib: pip install matplotlib (or 'hfbert[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


# -- the inputs -----------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    batches: list[dict[str, Tensor]]  # forward keyword arguments, one dict per batch

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batches": len(self.batches),
            "sequences": sum(len(batch["input_ids"]) for batch in self.batches),
            "real_tokens": sum(int(batch["attention_mask"].sum()) for batch in self.batches),
            "longest": max(batch["input_ids"].shape[1] for batch in self.batches),
        }


def build_cases(tokenizer: Any, texts: Sequence[str], batch_size: int, max_length: int, segments: int) -> list[Case]:
    """The battery described in the module docstring, as forward keyword arguments."""
    if not texts:
        raise ValueError("no texts to run")
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")

    def encode(first: list[str], second: list[str] | None = None, **options: Any) -> dict[str, Tensor]:
        return dict(tokenizer(first, second, truncation=True, max_length=max_length, return_tensors="pt", **options))

    def chunks(items: Sequence[Any]) -> Iterator[list[Any]]:
        for start in range(0, len(items), batch_size):
            yield list(items[start : start + batch_size])

    cases = [Case("single", [encode([text]) for text in texts])]
    if segments >= 2 and len(texts) >= 2:
        pairs = list(zip(texts[0::2], texts[1::2], strict=False))  # an odd last text has no partner
        batches = [encode([a for a, _ in chunk], [b for _, b in chunk], padding=True) for chunk in chunks(pairs)]
        cases.append(Case("pairs", batches))
    cases.append(Case("right padding", [encode(chunk, padding=True) for chunk in chunks(texts)]))
    left = [encode(chunk, padding=True, padding_side="left") for chunk in chunks(texts)]
    for batch in left:
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    cases.append(Case("left padding", left))
    # Repeat the texts until they are longer than the model's maximum length, then truncate to exactly it.
    words = len(tokenizer(" ".join(texts))["input_ids"])
    long_text = " ".join(list(texts) * (max_length // max(1, words - 2) + 1))
    longest = encode([long_text])
    if longest["input_ids"].shape[1] == max_length:
        cases.append(Case("max length", [longest]))
    return cases


# -- running both models --------------------------------------------------------------------------------------


@contextmanager
def _quiet_transformers(transformers: Any) -> Iterator[None]:
    """No load reports or "Loading weights" bars from transformers while the reference models load."""
    logging = transformers.utils.logging
    verbosity = logging.get_verbosity()
    progress = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if progress:
            logging.enable_progress_bar()


@contextmanager
def _no_tf32(active: bool) -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if active:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def load_reference(transformers: Any, class_name: str, directory: Path, attn: str, **kwargs: Any) -> Any:
    """A transformers model, failing (rather than comparing against random weights) if it initialised any."""
    with _quiet_transformers(transformers):
        model, info = getattr(transformers, class_name).from_pretrained(
            directory, attn_implementation=attn, output_loading_info=True, **kwargs
        )
    if info["missing_keys"] or info["mismatched_keys"]:
        missing = sorted(info["missing_keys"]) + [str(key) for key in info["mismatched_keys"]]
        raise ValueError(f"{directory}: transformers.{class_name} could not load {', '.join(missing[:5])}")
    return model


def _describe_files(files: list[Path]) -> list[dict[str, Any]]:
    from converters.hub import sha256_of

    return [{"name": file.name, "bytes": file.stat().st_size, "sha256": sha256_of(file)} for file in files]


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
    standard_linear: bool = False,
    progress: bool = True,
) -> ParityReport:
    """Compare hfbert with transformers on `model_path` (a local directory or a Hub repo id); see the module
    docstring for what runs and what is compared. `reference`: load transformers from this checkpoint instead
    (default: `model_path`), e.g. to check a converted or re-saved copy against its original. `standard_linear`:
    run hfbert's linear layers on transformers' kernel instead of the faster oneDNN one (`hfbert/linear.py`), so
    that only the port itself can differ."""
    transformers = import_transformers()
    import hfbert
    import hfbert.linear
    from converters.checkpoint_files import read_checkpoint
    from converters.hub import resolve_checkpoint
    from converters.key_map import normalize_name

    started = time.perf_counter()
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    dtype_name = next(name for name, value in DTYPES.items() if value == dtype)
    if attn not in ("eager", "sdpa"):
        raise ValueError(f"attn must be 'eager' or 'sdpa', not {attn!r}")
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine")
    tolerance = tolerance_for(device, dtype)

    directory = Path(resolve_checkpoint(model_path, revision, include_tokenizer=True))
    checkpoint = read_checkpoint(directory)
    stored = {normalize_name(name) for name in checkpoint.tensors}
    has_pooler = any(name.startswith("pooler.") for name in stored)
    has_mlm_head = any(name.startswith("cls.predictions.") for name in stored)
    weight_files = _describe_files(checkpoint.files)
    del checkpoint
    reference_directory = Path(resolve_checkpoint(reference)) if reference is not None else directory
    reference_files = _describe_files(read_checkpoint(reference_directory).files) if reference is not None else []

    tokenizer = hfbert.BertTokenizer.from_pretrained(directory)
    ours = hfbert.BertModel.from_pretrained(
        directory, dtype=dtype, device=device, attn_implementation=attn, add_pooling_layer=has_pooler
    )
    config = ours.config
    theirs = load_reference(transformers, "BertModel", reference_directory, attn, add_pooling_layer=has_pooler)
    theirs = theirs.to(device=device, dtype=dtype).eval()
    cases = build_cases(
        tokenizer, list(texts or default_texts()), batch_size, config.max_position_embeddings, config.type_vocab_size
    )

    layers = config.num_hidden_layers
    attention_note = "eager pass" if attn == "sdpa" else ""
    rows = {"embeddings": Row("embeddings", 0, tolerance, Stats())}
    rows.update({f"layer {i}": Row(f"layer {i}", 2 * i + 2, tolerance, Stats()) for i in range(layers)})
    if has_pooler:
        rows["pooler"] = Row("pooler", 2 * layers + 1, tolerance, Stats())
    for i in range(layers):
        rows[f"attentions layer {i}"] = Row(f"attentions layer {i}", 2 * i + 1, tolerance, Stats(), note=attention_note)
    if has_mlm_head:
        rows["mlm logits"] = Row("mlm logits", 2 * layers + 2, tolerance, Stats())
        rows[f"mlm top-{TOP_K}"] = Row(f"mlm top-{TOP_K}", 2 * layers + 3, tolerance, TopKStats())

    passes = ["backbone"] + (["eager attentions"] if attn == "sdpa" else []) + (["masked LM"] if has_mlm_head else [])
    from tqdm.auto import tqdm

    total = len(passes) * sum(len(case.batches) for case in cases)
    kernel_choice = hfbert.linear.standard_linear() if standard_linear else nullcontext()
    with _no_tf32(torch.device(device).type == "cuda" and dtype == torch.float32), torch.no_grad(), kernel_choice:
        linear_kernel = hfbert.linear.inference_kernel(device, dtype)
        # disable=None: a bar only when stderr is a terminal
        bar = tqdm(total=total, desc="parity", unit="batch", disable=None if progress else True, file=sys.stderr)
        for name in passes:
            if name == "eager attentions":
                ours.set_attn_implementation("eager")
                theirs = load_reference(
                    transformers, "BertModel", reference_directory, "eager", add_pooling_layer=has_pooler
                )
                theirs = theirs.to(device=device, dtype=dtype).eval()
            elif name == "masked LM":
                del ours, theirs
                ours = hfbert.BertForMaskedLM.from_pretrained(
                    directory, dtype=dtype, device=device, attn_implementation=attn
                )
                theirs = load_reference(transformers, "BertForMaskedLM", reference_directory, attn)
                theirs = theirs.to(device=device, dtype=dtype).eval()
            bar.set_postfix_str(name)
            for case in cases:
                for batch in case.batches:
                    batch = {key: value.to(device) for key, value in batch.items()}
                    _compare_batch(name, case.name, batch, ours, theirs, rows, attentions=attn == "eager")
                    bar.update()
        bar.close()

    return ParityReport(
        model=str(model_path),
        model_path=str(directory),
        reference_path=str(reference_directory),
        device=str(device),
        dtype=dtype_name,
        attn=attn,
        linear_kernel=linear_kernel,
        tolerance=tolerance,
        num_layers=layers,
        versions={
            "hfbert": hfbert.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "device_name": torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu",
        },
        weight_files=weight_files,
        reference_weight_files=reference_files,
        cases=[case.describe() for case in cases],
        rows=list(rows.values()),
        seconds=round(time.perf_counter() - started, 3),
    )


def _compare_batch(
    kind: str, case: str, batch: dict[str, Tensor], ours: Any, theirs: Any, rows: dict[str, Row], attentions: bool
) -> None:
    """One forward of both models on `batch`; record what this pass compares, at real positions only.
    `attentions`: whether the backbone pass also returns attention probabilities (eager models)."""
    real = batch["attention_mask"].bool()
    if kind == "masked LM":
        ours_logits, their_logits = ours(**batch).logits[real], theirs(**batch).logits[real]
        rows["mlm logits"].update(case, ours_logits, their_logits)
        rows[f"mlm top-{TOP_K}"].update(case, ours_logits, their_logits)
        return
    with_hidden_states = kind == "backbone"
    with_attentions = kind == "eager attentions" or attentions
    options = dict(output_hidden_states=with_hidden_states, output_attentions=with_attentions, return_dict=True)
    a, b = ours(**batch, **options), theirs(**batch, **options)
    if with_hidden_states:
        if len(a.hidden_states) != len(b.hidden_states):
            raise ValueError(f"{len(a.hidden_states)} hidden states in hfbert, {len(b.hidden_states)} in transformers")
        for index, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states, strict=True)):
            rows["embeddings" if index == 0 else f"layer {index - 1}"].update(case, x[real], y[real])
        if "pooler" in rows:
            rows["pooler"].update(case, a.pooler_output, b.pooler_output)
    if with_attentions:
        for index, (x, y) in enumerate(zip(a.attentions, b.attentions, strict=True)):
            # (batch, heads, query, key) -> the rows of real query tokens, every key: (tokens * heads, key)
            x, y = x.transpose(1, 2)[real].flatten(0, 1), y.transpose(1, 2)[real].flatten(0, 1)
            rows[f"attentions layer {index}"].update(case, x, y)
