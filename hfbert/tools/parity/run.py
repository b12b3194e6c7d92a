"""`run_parity`: check the options, resolve the paths, load hfbert and transformers once, run the battery, return the
report."""

from __future__ import annotations

import gc
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from converters.dtypes import DTYPES
from converters.errors import CheckpointError
from hfbert.modeling.attention import ATTENTION_IMPLEMENTATIONS
from hfbert.platform.cpu import cpu_flags, cpu_name, instruction_set
from hfbert.platform.mkl import mkl_branch
from hfbert.platform.threads import threads_setting
from hfbert.tools.extras import import_transformers
from hfbert.tools.inspect import describe_files
from hfbert.tools.parity.artifact_paths import ParityPaths, resolve_paths
from hfbert.tools.parity.artifacts import ArtifactCheck
from hfbert.tools.parity.cases import LEFT_PADDING, Case, build_cases, default_texts, has_padding
from hfbert.tools.parity.causes import attention_mismatch, padding_blind_positions, position_offset
from hfbert.tools.parity.compare import compare_batch
from hfbert.tools.parity.engines import hfbert_engine, open_artifact, transformers_engine
from hfbert.tools.parity.engines.base import ModelSpec, TorchEngine, installed_version
from hfbert.tools.parity.engines.reference import no_tf32
from hfbert.tools.parity.report import ParityReport
from hfbert.tools.parity.sentences import CASE as SENTENCE_CASE
from hfbert.tools.parity.sentences import SentenceStats, embed, read_sentence_pipeline
from hfbert.tools.parity.statistics import ACCURACY_RATIO, TOP_K, Accuracy, Row, TopKStats

# hfbert's linear layers as built (`nn.Linear`), or swapped by `hfbert.optimize_for_inference`: "packed" (its
# default, precision "highest": judged by ACCURACY_RATIO) or "fast" (precision "high": judged by its own bound).
LINEAR_KERNELS = (None, "standard", "packed", "fast")


# The longest sequence the battery runs: past it, the attention maps compared per layer (heads x length^2, in three
# models, one in float64) outgrow a 24 GB machine (ModernBERT's 8,192 tokens would need about 6 GB per layer).
MAX_BATTERY_LENGTH = 2048


def fast_mode_bound() -> float:
    """The bound of `optimize_for_inference(model, precision="high")` (hfbert.inference.ACCURACY_BOUNDS["high"])."""
    from hfbert.inference import ACCURACY_BOUNDS

    return float(ACCURACY_BOUNDS["high"])


@dataclass(frozen=True)
class ParityOptions:
    """How a parity run runs: every argument of `run_parity` but where its inputs lie (`resolve_paths`), checked
    here, once, before anything loads."""

    device: str = "cpu"  # hfbert's and transformers' (the float64 reference runs eager, on the same device)
    dtype: torch.dtype | str = "float32"  # a name in converters.dtypes.DTYPES or a torch.dtype, held as the dtype
    attn: str = "sdpa"
    texts: Sequence[str] | None = None  # the battery (default: the shipped sentences), in batches of batch_size
    batch_size: int = 8
    linear_kernel: str | None = None  # one of LINEAR_KERNELS (None: "standard")
    tolerance: float | None = None  # also require max abs against transformers to be at most this
    progress: bool = True
    artifacts: bool = False  # deployed artifacts judged (on the CPU, in float32), each output within artifact_bound
    artifact_bound: float = ACCURACY_RATIO  # x transformers' fp32 error
    artifact_precision: str = "f32"  # OpenVINO's precision hint ("f32", or "default": the CPU's own choice)
    # A checkpoint whose config.json maps the model to custom code (auto_map) is refused before anything loads, as
    # from_pretrained refuses it, unless this says its weights are plain BERT.
    ignore_auto_map: bool = False

    def __post_init__(self) -> None:
        dtype = DTYPES[self.dtype] if isinstance(self.dtype, str) else self.dtype
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "texts", tuple(self.texts) if self.texts is not None else None)
        if self.attn not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attn must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, not {self.attn!r}")
        if self.linear_kernel not in LINEAR_KERNELS:
            kernels = ", ".join(map(str, LINEAR_KERNELS))
            raise ValueError(f"linear_kernel must be one of {kernels}, not {self.linear_kernel!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {self.batch_size}")
        if self.tolerance is not None and not self.tolerance >= 0:
            raise ValueError(f"tolerance must be a number >= 0, got {self.tolerance}")
        if self.device_type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r}: CUDA is not available on this machine")
        if self.device_type == "mps":
            raise ValueError(
                f"device {self.device!r}: the float64 reference cannot run on mps (it has no float64); use cpu"
            )
        if not self.artifact_bound > 0:
            raise ValueError(f"artifact bound must be a number > 0, got {self.artifact_bound}")
        if self.artifacts and self.device_type != "cpu":
            raise ValueError(f"device {self.device!r}: deployed artifacts run on the CPU; run with --device cpu")
        if self.artifacts and dtype != torch.float32:
            raise ValueError(
                f"dtype {self.dtype_name}: artifacts are judged against transformers' fp32 error; use float32"
            )

    @property
    def device_type(self) -> str:
        return torch.device(self.device).type

    @property
    def dtype_name(self) -> str:
        return next(name for name, value in DTYPES.items() if value == self.dtype)

    @property
    def precision(self) -> str:
        """The optimize_for_inference precision whose bound applies."""
        return "high" if self.linear_kernel == "fast" else "highest"

    @property
    def bound(self) -> float:
        """hfbert's bound: ACCURACY_RATIO, or the fast mode's own (`fast_mode_bound`)."""
        return fast_mode_bound() if self.linear_kernel == "fast" else ACCURACY_RATIO


def run_parity(
    model_path: str | os.PathLike | ParityPaths,
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
    """Compare hfbert with transformers, and both with transformers in float64, on `model_path` (a local directory
    or a Hub repo id, or the `ParityPaths` that `resolve_paths` gave); see the module docstring for what runs, what
    is compared and when it passes. `revision`, `reference`, `artifacts`, `artifact_names`, `cache_dir`, `token`:
    where the inputs lie, as `resolve_paths` takes them; `model_name`: what the report calls the model (default:
    `model_path` as given); the rest: how it runs, as `ParityOptions` holds them."""
    from hfbert.modeling.tokenizer import AutoTokenizer

    transformers = import_transformers()
    started = time.perf_counter()
    given = model_path.artifacts if isinstance(model_path, ParityPaths) else artifacts
    options = ParityOptions(
        device=device,
        dtype=dtype,
        attn=attn,
        texts=texts,
        batch_size=batch_size,
        linear_kernel=linear_kernel,
        tolerance=tolerance,
        progress=progress,
        artifacts=bool(given),
        artifact_bound=artifact_bound,
        artifact_precision=artifact_precision,
        ignore_auto_map=ignore_auto_map,
    )
    where = {"revision": revision, "reference": reference, "artifact_names": artifact_names, "cache_dir": cache_dir}
    paths = _paths(model_path, artifacts, **where, token=token)
    facts = _CheckpointFacts.read(paths, options.ignore_auto_map)
    checks = _open_artifacts(paths, facts, options)  # first: one that cannot run fails before the models load
    tokenizer = AutoTokenizer.from_pretrained(paths.directory)
    ours, theirs, exact, ran_kernel = _load_models(transformers, paths, facts, options)
    runners = (ours, theirs, exact)
    reference_attn = theirs.model.config._attn_implementation
    config = ours.model.config
    battery = _Battery.build(tokenizer, config, facts, options, checks, paths)
    battery.run(runners, options, config.max_position_embeddings, facts.first_position)
    del runners, ours, theirs, exact
    gc.collect()
    return ParityReport(
        model=str(model_name if model_name is not None else paths.model),
        model_path=str(paths.directory),
        reference_path=str(paths.reference_directory),
        device=str(options.device),
        dtype=options.dtype_name,
        attn=options.attn,
        reference_attn=reference_attn,
        linear_kernel=ran_kernel,
        instruction_set=instruction_set(),
        tolerance=options.tolerance,
        num_layers=config.num_hidden_layers,
        versions=_environment(transformers, options),
        weight_files=facts.weight_files,
        reference_weight_files=facts.reference_weight_files,
        cases=[case.describe() for case in battery.cases],
        rows=list(battery.rows.values()),
        seconds=round(time.perf_counter() - started, 3),
        accuracy_bound=options.bound,
        precision=options.precision,
        artifacts=battery.checks,
        sentence_pipeline=battery.pipeline.describe() if battery.pipeline is not None else "",
        sentence_baseline=battery.baseline.numbers(),
    )


def _environment(transformers: Any, options: ParityOptions) -> dict[str, str]:
    """The report's environment line: the versions, the device's name, MKL's branch and OpenMP's threads."""
    return {
        "hfbert": installed_version("hfbert"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device_name": torch.cuda.get_device_name(options.device) if options.device_type == "cuda" else cpu_name(),
        "mkl": mkl_branch(),
        "threads": threads_setting(),
    }


def _open_artifacts(paths: ParityPaths, facts: _CheckpointFacts, options: ParityOptions) -> list[ArtifactCheck]:
    checks = []
    for name, path in zip(paths.artifact_names, paths.artifacts, strict=True):
        engine = open_artifact(path, facts.hidden_size, torch.get_num_threads(), options.artifact_precision)
        engine.first_position = facts.first_position  # for a graph that takes position_ids
        engine.token_types = facts.token_types > 0
        checks.append(
            ArtifactCheck(name, engine, options.artifact_bound, instruction_set=instruction_set(), vnni=has_vnni())
        )
    return checks


def _load_models(
    transformers: Any, paths: ParityPaths, facts: _CheckpointFacts, options: ParityOptions
) -> tuple[TorchEngine, TorchEngine, TorchEngine, str]:
    """The three models a batch runs through, one per library, loaded once (`ModelSpec`): hfbert's, transformers'
    and its float64 twin; and the linear kernel hfbert's runs."""
    spec = ModelSpec(
        facts.has_mlm_head,
        facts.has_pooler,
        options.dtype,
        options.device,
        options.attn,
        facts.model_type,
    )
    if facts.family_error is not None:  # where hfbert's load finds it: after the tokenizer, before any model
        raise facts.family_error
    ours, ran_kernel = hfbert_engine.load(
        paths.directory, spec, options.linear_kernel, options.ignore_auto_map, config=facts.config
    )
    theirs, exact = transformers_engine.load(transformers, paths.reference_directory, spec)
    return ours, theirs, exact, ran_kernel


def _paths(
    model_path: str | os.PathLike | ParityPaths, artifacts: Sequence[str | os.PathLike], **named: Any
) -> ParityPaths:
    """`model_path` resolved (`resolve_paths`), or as resolved already: then no other argument names a path."""
    if not isinstance(model_path, ParityPaths):
        return resolve_paths(model_path, artifacts=artifacts, **named)
    given = [name for name, value in named.items() if value is not None] + (["artifacts"] if artifacts else [])
    if given:
        raise ValueError(
            f"{', '.join(given)}: given with paths already resolved (ParityPaths); give them to resolve_paths"
        )
    return model_path


@dataclass(frozen=True)
class _CheckpointFacts:
    """What the run knows of the checkpoint (and its reference) before the models load: its config.json, read once
    (hfbert's model is built from it), and its family member's facts."""

    config: Any  # hfbert's EncoderConfig (the member's config class) of the checkpoint's config.json
    has_pooler: bool
    has_mlm_head: bool
    hidden_size: int
    model_type: str  # config.json's: which family's classes load it, in both libraries
    first_position: int  # the position of a sequence's first token: 0, RoBERTa's pad_token_id + 1, MPNet's 2
    token_types: int  # type_vocab_size; 0 for a model without token-type embeddings (MPNet)
    weight_files: list[dict[str, Any]]
    reference_weight_files: list[dict[str, Any]]
    # The loader's refusal of tensors named for another member than config.json's, naming config.json as it names
    # it (hfbert's model is then loaded from `config`, not from the file): raised when the models load.
    family_error: CheckpointError | None = None

    @classmethod
    def read(cls, paths: ParityPaths, ignore_auto_map: bool) -> _CheckpointFacts:
        from converters.checkpoint_files import read_checkpoint
        from converters.hub import CONFIG_FILE
        from converters.key_map import head_of, normalize_name
        from converters.loading import check_auto_map, check_family
        from hfbert.modeling.config import EncoderConfig
        from hfbert.modeling.family import member

        reference_files = []
        if paths.reference is not None:  # checked as hfbert checks a config (naming the file), before transformers
            reference_files = describe_files(read_checkpoint(paths.reference).files)
            EncoderConfig.from_json_file(paths.reference / CONFIG_FILE)
        config = EncoderConfig.from_pretrained(paths.directory)
        if not ignore_auto_map:
            check_auto_map(config.to_dict().get("auto_map"), str(paths.directory / CONFIG_FILE))
        family = member(config.model_type)
        layout = family.key_layout
        checkpoint = read_checkpoint(paths.directory)
        try:
            check_family(family.classes["model"], config, checkpoint)
            family_error = None
        except CheckpointError as error:
            family_error = error
        stored = {normalize_name(name, layout) for name in checkpoint.tensors}
        weight_files = describe_files(checkpoint.files)
        del checkpoint
        return cls(
            config=config,
            # the encoder's pooler, not a head of that name (DeBERTa's classifiers keep a ContextPooler in `pooler.`)
            has_pooler=any(name.startswith("pooler.") and head_of(name, layout) is None for name in stored),
            # every module of the masked-LM head (a ModernBERT classifier save has its `head.` but no `decoder.`)
            has_mlm_head=all(any(head_of(name, layout) == head for name in stored) for head in family.masked_lm_heads),
            hidden_size=config.hidden_size,
            model_type=config.model_type,
            first_position=family.positions.first_position(config),
            token_types=config.type_vocab_size if family.token_types else 0,
            weight_files=weight_files,
            reference_weight_files=reference_files,
            family_error=family_error,
        )


@dataclass
class _Battery:
    """The cases, the rows they fill, the artifacts judged on them, and (with artifacts) the checkpoint's sentence
    pipeline with transformers' and the float64 model's sentence numbers, against which the artifacts' are read."""

    cases: list[Case]
    rows: dict[str, Row]
    checks: list[ArtifactCheck]
    pipeline: Any
    baseline: SentenceStats = field(default_factory=SentenceStats)

    @classmethod
    def build(
        cls,
        tokenizer: Any,
        config: Any,
        facts: _CheckpointFacts,
        options: ParityOptions,
        checks: list[ArtifactCheck],
        paths: ParityPaths,
    ) -> _Battery:
        """The battery's cases (the run's texts, tokenized as the checkpoint's tokenizer does, as long as the model
        takes up to MAX_BATTERY_LENGTH), the rows they fill, and each artifact told what the cases cannot
        exercise."""
        cases = build_cases(
            tokenizer,
            list(options.texts or default_texts()),
            options.batch_size,
            min(config.max_sequence_length, MAX_BATTERY_LENGTH),
            facts.token_types,
            facts.first_position,
        )
        gives_types = "token_type_ids" in cases[0].batches[0]  # XLM-R's tokenizer gives none, whatever the model has
        for check in checks:
            check.untested = {case.name: case.note for case in cases if not case.exercised}
            check.engine.token_types = check.engine.token_types and gives_types  # a graph without them is then whole
        pipeline = read_sentence_pipeline(paths.directory, config, tokenizer.model_max_length) if checks else None
        return cls(cases, _rows(config.num_hidden_layers, facts, options), checks, pipeline)

    def run(
        self,
        runners: tuple[TorchEngine, TorchEngine, TorchEngine],
        options: ParityOptions,
        max_positions: int,
        first_position: int = 0,
    ) -> None:
        """Every batch through the three models and each artifact, compared as it comes. An artifact whose last
        hidden state fails is then tried with shifted positions (`position_offset`)."""
        from hfbert.tools.progress import Progress

        if options.device_type == "cpu":
            # Freed memory kept for the next batch, process-wide (hfbert.platform.allocator): without it, every cast
            # of the float64 reference's weights and every large output faults its pages in anew.
            from hfbert.platform.allocator import keep_freed_memory

            keep_freed_memory()
        cases, checks, pipeline = self.cases, self.checks, self.pipeline
        attentions = options.attn == "eager"  # eager: one call of each model gives the attention probabilities too
        with no_tf32(options.device_type == "cuda"), torch.no_grad():
            # A bar on a terminal, a line every 30 s in a log (hfbert.tools.progress).
            bar = Progress(sum(len(case.batches) for case in cases), "parity", "batch", enabled=options.progress)
            for case in cases:
                bar.set_postfix_str(case.name)
                for index, batch in enumerate(case.batches):
                    batch = {key: value.to(options.device) for key, value in batch.items()}
                    kept = compare_batch(case.name, batch, runners, self.rows, options.dtype, options.bound, attentions)
                    texts_once = index < len(case.batches) - case.added  # an added batch repeats texts: no sentences
                    for check in checks:
                        check.update(case.name, batch, *kept, pipeline if texts_once else None)
                    if pipeline is not None and case.name == SENTENCE_CASE and texts_once:
                        mask = batch["attention_mask"]
                        self.baseline.add(*(embed(pipeline, named["last_hidden_state"], mask) for named in kept))
                    del kept
                    bar.update()
            bar.close()
            for check in checks:
                self.diagnose(check, runners[2], max_positions, first_position)

    def diagnose(self, check: ArtifactCheck, exact: TorchEngine, max_positions: int, first_position: int) -> None:
        """A failing artifact's last hidden state tried against float64 at other positions: shifted ones
        (`position_offset`), and, where the graph computes its own positions and fails on left padding, each
        column's (`padding_blind_positions`); for local and global layers, under another window or rotary base
        (`attention_mismatch`)."""
        row = check.rows.get("last_hidden_state")
        if row is None or row.passed or check.error is not None:
            return
        probe = next((case.batches[0] for case in self.cases if case.name == SENTENCE_CASE), None)
        if probe is not None:
            check.position_offset = position_offset(check.engine.run, exact, probe, max_positions, first_position)
            check.attention_mismatch = attention_mismatch(check.engine.run, exact, probe)
        left = row.by_case.get(LEFT_PADDING)
        if left is None or left.passed or not first_position or "position_ids" in check.engine.inputs:
            return
        padded = (batch for case in self.cases if case.name == LEFT_PADDING for batch in case.batches)
        batch = next((batch for batch in padded if has_padding(batch)), None)
        if batch is not None:
            check.padding_positions = padding_blind_positions(
                check.engine.run, exact, batch, max_positions, first_position
            )


def _rows(layers: int, facts: _CheckpointFacts, options: ParityOptions) -> dict[str, Row]:
    """Every output compared, in the table's order; the index of each orders them as the plot draws them."""

    def accuracy() -> Accuracy:
        return Accuracy(options.dtype, options.tolerance, bound=options.bound)

    attention_note = "eager pass" if options.attn == "sdpa" else ""
    rows = {"embeddings": Row("embeddings", 0, accuracy)}
    rows.update({f"layer {i}": Row(f"layer {i}", 2 * i + 2, accuracy) for i in range(layers)})
    if facts.has_pooler:
        rows["pooler"] = Row("pooler", 2 * layers + 1, accuracy)
    for i in range(layers):
        rows[f"attentions layer {i}"] = Row(f"attentions layer {i}", 2 * i + 1, accuracy, note=attention_note)
    if facts.has_mlm_head:
        rows["mlm logits"] = Row("mlm logits", 2 * layers + 2, accuracy)
        rows[f"mlm top-{TOP_K}"] = Row(f"mlm top-{TOP_K}", 2 * layers + 3, TopKStats)
    return rows


def has_vnni() -> bool:
    """Whether the CPU multiplies u8 x s8 with VNNI (AVX512_VNNI or AVX_VNNI): without it, the products of
    dynamically quantized int8 graphs saturate in 16 bits."""
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(cpu_flags()))
