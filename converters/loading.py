"""`load_pretrained`: checkpoint directory or repo id -> a validated model in eval mode, in one pass.

1. resolve the source to a local directory (`hub.resolve_checkpoint`);
2. read config.json into a `BertConfig` (keyword overrides applied) and build the model on the meta device
   (no memory, no random init);
3. read the tensors (memory-mapped) and map every name through `key_map.map_key` for this model's heads;
4. compare against the model's parameters: missing, unexpected, shape-mismatched -> `LoadReport`;
5. with `strict=True` any problem raises `CheckpointError` before the model is touched: never half-loaded.
   One exception, as every fine-tuning recipe expects: a task head the checkpoint does not have at all (a
   classifier on top of bert-base-uncased) is initialised as transformers does and reported as a new head;
6. assign the tensors as the parameters (`load_state_dict(assign=True)`), casting only if `dtype` asks (a cast
   that turns finite weights into Inf, fp32 1e6 -> fp16, is refused as a stored Inf is), then tie the MLM decoder
   to the word embeddings.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from converters.checkpoint_files import CheckpointTensors, read_checkpoint
from converters.dtypes import PARAMETER_DTYPES, dtype_name
from converters.errors import CheckpointError
from converters.hub import CONFIG_FILE, resolve_checkpoint
from converters.key_map import BERT_KEYS, KeyLayout, check_legacy_buffer, family_of_prefix, map_key, normalize_name
from converters.load_report import LoadReport

# hfbert's logger: what transformers warns about on its own logger (a tie not made, heads re-initialised) goes here.
log = logging.getLogger("hfbert")


def load_pretrained(
    model_class: type[nn.Module],
    path_or_repo_id: str | os.PathLike,
    *,
    revision: str | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    strict: bool = True,
    output_loading_info: bool = False,
    config: Any = None,
    model_args: tuple[Any, ...] = (),
    ignore_auto_map: bool = False,
    subfolder: str = "",
    **kwargs: Any,
) -> nn.Module | tuple[nn.Module, dict[str, Any]]:
    """See `BertPreTrainedModel.from_pretrained`. `config` (a config object) replaces config.json, as in
    transformers; `kwargs` that name config fields override it (e.g. `num_labels=3`); `model_args` and the other
    kwargs go to the model's constructor (e.g. `add_pooling_layer=False`). The attention implementation is set on
    the config (`config._attn_implementation`), where every model reads it, not passed to the constructor.
    A config whose `auto_map` sends the model to custom code is refused (`check_auto_map`) unless
    `ignore_auto_map=True` says the weights are plain BERT. `subfolder` is the checkpoint's folder inside the
    directory or repo, as in transformers."""
    config_class = model_class.config_class
    check_requested_dtype(dtype)
    directory = resolve_checkpoint(path_or_repo_id, revision, subfolder=subfolder)
    if config is None:
        config = config_class.from_json_file(directory / CONFIG_FILE)
    else:  # a copy, as transformers makes: the caller's object is never changed by the load
        # Messages name the file a config was read from (hfbert's configs know it), else the argument.
        source = getattr(config, "source", None) or f"{directory / CONFIG_FILE} (config=)"
        config = config_class.from_object(config, source=source)
    if not ignore_auto_map:
        check_auto_map(config.to_dict().get("auto_map"), config.source or str(directory / CONFIG_FILE), model_class)
    config_fields = {field.name for field in dataclasses.fields(config_class)}
    overrides = {key: value for key, value in kwargs.items() if key in config_fields}
    if overrides:
        values = config.to_dict()
        if "num_labels" in overrides and "id2label" not in overrides:
            values.pop("id2label", None), values.pop("label2id", None)
        config = config_class.from_dict({**values, **overrides}, source=config.source)
    checkpoint = read_checkpoint(directory)
    check_family(model_class, config, checkpoint)
    constructor_kwargs = {key: value for key, value in kwargs.items() if key not in config_fields}
    with torch.device("meta"), skipped_initialisation():
        config._attn_implementation = attn_implementation
        model = model_class(config, *model_args, **constructor_kwargs)

    tied = model.tied_weights()
    heads = model_heads(model)
    expected_shapes = {name: tuple(t.shape) for name, t in model.state_dict().items() if name not in tied}
    state, report = match_checkpoint(
        checkpoint,
        expected_shapes,
        config.max_position_embeddings,
        str(directory),
        heads,
        model.base_prefix,
        tied,
        model.key_layout,
    )
    for target, source in report.untied.items():  # a parameter of its own now, shaped as its source
        expected_shapes[target] = expected_shapes[source]
    new_head = _new_head_parameters(report, heads)
    for name in new_head:
        report.missing.remove(name)
        report.new_head.append(name)
    # Every check runs before any memory is allocated: a config.json that implies a (1 PB) head fails here, in
    # milliseconds, not after minutes of random initialisation.
    if strict and report.problems:
        raise CheckpointError(_strict_failure_message(directory, report, checkpoint))
    # Missing and mismatched tensors get here only with strict=False or ignore_mismatched_sizes=True.
    reinitialised = report.missing + [name for name, _, _ in report.mismatched]
    check_initialised_size({name: expected_shapes[name] for name in new_head + reinitialised}, checkpoint, directory)
    for name in new_head + reinitialised:
        owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        state[name] = initial_value(name, expected_shapes[name], config, owner)
    report.initialized.extend(reinitialised)

    dtype = dtype or _stored_dtype(state, checkpoint)
    stored = state
    state = {name: tensor.to(device=device, dtype=dtype) for name, tensor in state.items()}
    for name, tensor in state.items():  # before anything is assigned: an overflow leaves no model behind
        origin = functools.partial(_origin, name, checkpoint, heads, model.base_prefix, model.key_layout)
        check_cast(name, stored[name], tensor, origin, "load as")
    model.load_state_dict(state, strict=False, assign=True)
    if report.untied:
        model._untied_weights = frozenset(report.untied)
    model.tie_weights()
    left_on_meta = [name for name, parameter in model.named_parameters() if parameter.is_meta]
    if left_on_meta:  # would be a bug in the checks above; never hand out such a model
        raise CheckpointError(f"{directory}: internal error: parameters not filled: {', '.join(left_on_meta)}")
    model.name_or_path = str(directory)
    model.eval()
    _warn_about(report, model_class, directory, checkpoint)
    if output_loading_info:
        return model, report.to_loading_info()
    return model


def check_requested_dtype(dtype: torch.dtype | None) -> None:
    """A requested `dtype` is checked as a stored one is: one the kernels run (fp8 / fp4 would load into a model
    whose first forward raises NotImplementedError), else ValueError naming the accepted ones."""
    if dtype is not None and dtype not in PARAMETER_DTYPES:
        raise ValueError(
            f"dtype={dtype_name(dtype)}: parameters must be one of "
            f"{', '.join(dtype_name(dtype) for dtype in PARAMETER_DTYPES)} (BERT's kernels do not run {dtype})"
        )


def check_cast(name: str, original: Tensor, result: Tensor, where: str | Callable[[], str], action: str) -> None:
    """Raise `CheckpointError` when `result` (`original` cast to another dtype) holds Inf values that `original`
    did not: finite weights beyond the new dtype's range (65504 for float16). `where` names the file (or finds it,
    only when there is something to report), `action` the operation ("load as", "convert to").

    Rounding is monotonic, so when `original`'s smallest and largest values cast to finite numbers every value
    does: the usual case costs one float32 min/max pass over `original` (a reduction over the float16 result runs
    several times slower on CPUs without native fp16), and nothing for a cast to a dtype of wider range."""
    if result.dtype == original.dtype or not (result.is_floating_point() and original.is_floating_point()):
        return
    if original.numel() == 0 or torch.finfo(result.dtype).max >= torch.finfo(original.dtype).max:
        return
    if torch.isfinite(torch.stack(torch.aminmax(original)).to(result.dtype)).all():
        return
    overflowed = int((result.isinf().cpu() & ~original.isinf().cpu()).sum())
    if not overflowed:
        return
    largest = original[original.isfinite()].abs().max().item()
    wider = " or use bfloat16" if result.dtype == torch.float16 else ""
    where = where if isinstance(where, str) else where()
    raise CheckpointError(
        f"{where}: cannot {action} {dtype_name(result.dtype)}: {overflowed:,} values of tensor '{name}' overflow to "
        f"Inf (largest magnitude {largest:.4g}; {dtype_name(result.dtype)} holds at most "
        f"{torch.finfo(result.dtype).max:.6g}); keep {dtype_name(original.dtype)}{wider}"
    )


def _origin(
    target: str, checkpoint: CheckpointTensors, model_heads: tuple[str, ...], base_prefix: str, layout: KeyLayout
) -> str:
    """The file a model parameter was read from ("the checkpoint's files" for one it initialised)."""
    for name, file in checkpoint.origin.items():
        if map_key(name, model_heads, base_prefix, layout).target == target:
            return str(file)
    return ", ".join(str(file) for file in checkpoint.files)


@contextmanager
def skipped_initialisation() -> Iterator[None]:
    """Module constructors initialise their parameters. On the meta device that computes nothing, but its first
    call imports torch's compiler stack (about a second and 70 MB at cold start), and every parameter is assigned
    from the checkpoint anyway: so the init functions do nothing while the model is built."""
    names = [name for name in dir(nn.init) if name.endswith("_") and not name.startswith("_")]
    originals = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, _unchanged)
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(nn.init, name, function)


def _unchanged(tensor: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    return tensor


def match_checkpoint(
    checkpoint: CheckpointTensors,
    expected_shapes: dict[str, tuple[int, ...]],
    max_position_embeddings: int,
    source: str,
    model_heads: tuple[str, ...] = (),
    base_prefix: str = "",
    tied: dict[str, str] | None = None,
    layout: KeyLayout = BERT_KEYS,
) -> tuple[dict[str, Tensor], LoadReport]:
    """Map every checkpoint tensor to a model parameter; report what fits and what does not.

    `tied` maps parameters that are the same tensor as another (the MLM decoder weight -> the word embeddings),
    and a tie stands as transformers 5 makes it: a stored copy equal to its partner is skipped as ignored by design;
    one that differs is loaded as a parameter of its own (`report.untied`: the tie is not made); one whose partner
    the checkpoint lacks is loaded as the partner (the pair stored under the other name).
    """
    tied = tied or {}
    report = LoadReport(source=source)
    report.ignored_by_design.update(checkpoint.not_read)  # listed, so that a second weight file is never silent
    state: dict[str, Tensor] = {}
    claimed_by: dict[str, str] = {}
    tied_copies: list[tuple[str, str, Tensor]] = []
    has_pooler = base_prefix + "pooler.dense.weight" in expected_shapes
    for name, tensor in checkpoint.tensors.items():
        mapped = map_key(name, model_heads, base_prefix, layout)
        file = str(checkpoint.origin[name])
        if mapped.action == "ignored":
            report.ignored_by_design[name] = mapped.reason
            continue
        if mapped.action == "legacy buffer":
            check_legacy_buffer(mapped, tensor, max_position_embeddings, file)
            report.legacy_buffers.append(name)
            continue
        target = mapped.target
        if target in claimed_by:
            raise CheckpointError(f"{file}: tensors '{claimed_by[target]}' and '{name}' both map to '{target}'")
        claimed_by[target] = name
        if target in tied:
            tied_copies.append((name, target, tensor))
            continue
        if target not in expected_shapes:
            if normalize_name(name, layout).startswith("pooler.") and not has_pooler:
                report.ignored_by_design[name] = "pooler; the model is built without one"
            else:
                report.unexpected.append(name)
            continue
        if _accept(name, target, tensor, expected_shapes[target], file, state, report) and mapped.action == "renamed":
            report.renamed[name] = target
    for name, target, tensor in tied_copies:
        source = tied[target]
        partner = state.get(source)
        file = str(checkpoint.origin[name])
        if partner is None:
            if source in expected_shapes and source not in claimed_by:
                if _accept(name, source, tensor, expected_shapes[source], file, state, report):
                    report.renamed[name] = source
            else:  # its partner is stored but mismatched, or is no parameter of this model
                report.ignored_by_design[name] = f"tied to {source}; stored once"
        elif partner.shape == tensor.shape and partner.dtype == tensor.dtype and torch.equal(partner, tensor):
            report.ignored_by_design[name] = f"tied to {source}; stored once"
        else:
            report.untied[target] = source
            _accept(name, target, tensor, expected_shapes[source], file, state, report)
    mismatched = {name for name, _, _ in report.mismatched}
    report.missing = [name for name in expected_shapes if name not in state and name not in mismatched]
    return state, report


def _accept(
    name: str,
    target: str,
    tensor: Tensor,
    expected_shape: tuple[int, ...],
    file: str,
    state: dict[str, Tensor],
    report: LoadReport,
) -> bool:
    """Take checkpoint tensor `name` as parameter `target` when its shape is the model's (else report it
    mismatched and return False); refuse a dtype no kernel runs; report NaN / Inf values."""
    if tuple(tensor.shape) != expected_shape:
        report.mismatched.append((target, tuple(tensor.shape), expected_shape))
        return False
    if tensor.dtype not in PARAMETER_DTYPES:
        raise CheckpointError(
            f"{file}: tensor '{name}' has dtype {tensor.dtype}; parameters must be one of "
            f"{', '.join(dtype_name(dtype) for dtype in PARAMETER_DTYPES)}"
        )
    problem = non_finite(tensor)
    if problem:
        report.non_finite.append((name, problem))
    state[target] = tensor
    report.loaded.append(target)
    return True


def _warn_about(report: LoadReport, model_class: type, directory: Path, checkpoint: CheckpointTensors) -> None:
    """What transformers warns about when a load succeeds, on hfbert's logger: ties the checkpoint breaks, parameters
    initialised afresh because the checkpoint lacks them (a new task head, or any with strict=False), and those
    initialised afresh because their shape differs from the checkpoint's."""
    files = ", ".join(str(file) for file in checkpoint.files)
    initialised = sorted(report.new_head + report.missing)
    if initialised:
        # transformers' words, so that users (and the search engines they paste it into) recognise it.
        log.warning(
            "Some weights of %s were not initialized from the model checkpoint at %s and are newly initialized: "
            "%s\nYou should probably TRAIN this model on a down-stream task to be able to use it for predictions "
            "and inference.",
            model_class.__name__,
            directory,
            initialised,
        )
    for target, source in report.untied.items():
        log.warning(
            "%s: config.json ties '%s' to '%s' (tie_word_embeddings), but the checkpoint stores both, with different "
            "values: they are loaded apart and NOT tied, as transformers does. Set tie_word_embeddings to false in "
            "config.json to silence this warning.",
            files,
            target,
            source,
        )
    if report.mismatched:
        shapes = "\n".join(
            f"- {name}: found shape {stored} in the checkpoint and {expected} in the model instantiated"
            for name, stored, expected in report.mismatched
        )
        log.warning(
            "Some weights of %s were not initialized from the model checkpoint at %s and are newly initialized "
            "because the shapes did not match:\n%s\nYou should probably TRAIN this model on a down-stream task to be "
            "able to use it for predictions and inference.",
            model_class.__name__,
            directory,
            shapes,
        )


def check_family(model_class: type[nn.Module], config: Any, checkpoint: CheckpointTensors) -> None:
    """Refuse, before anything is built, a config.json of another family than the class (a RoBERTa config into
    `BertModel`) and tensors named for another family than config.json says (`bert.` tensors beside "roberta").
    `config` is a member's config (`member_layouts()`: model_type -> that member's names, for every member)."""
    where = config.source or "config.json"
    layouts = config.member_layouts()
    layout = layouts[config.model_type]
    if layout is not model_class.key_layout:
        raise CheckpointError(
            f"{where}: model_type {config.model_type!r} is not loaded by {model_class.__name__}; use its family's "
            "class (hfbert.AutoModel picks it from config.json)"
        )
    for name in checkpoint.tensors:
        family = family_of_prefix(name, layouts)
        if family is not None and layouts[family] is not layout:
            raise CheckpointError(
                f"{checkpoint.origin[name]}: tensor '{name}' is named as a {family!r} checkpoint's, but {where} says "
                f"model_type {config.model_type!r}; the config and the weights are of different models"
            )


def non_finite(tensor: Tensor) -> str:
    """'' when every value is finite, else how many NaN / Inf values and where the first one is.

    A float32 sum is finite exactly when no value is NaN or Inf (short of a sum beyond 3e38, which no trained
    weight reaches), so the common case reads the tensor once and allocates nothing; only a suspect tensor is
    scanned element by element.
    """
    if torch.isfinite(tensor.sum(dtype=torch.float32)):
        return ""
    nan, inf = tensor.isnan(), tensor.isinf()
    if not (nan.any() or inf.any()):
        return ""
    first = tuple(int(i) for i in (nan | inf).nonzero()[0])
    return f"{int(nan.sum())} NaN and {int(inf.sum())} Inf values, the first at index {first}"


# Parameters a load may create that the checkpoint does not hold (a new classifier; with strict=False, what is
# missing or mismatched): at most this many values beyond what the checkpoint stores. 2**25 values (128 MB in fp32)
# hold a 32,768-label classifier on bert-large; a config.json asking for more describes another checkpoint.
NEW_PARAMETER_ALLOWANCE = 2**25


def check_initialised_size(
    shapes: dict[str, tuple[int, ...]], checkpoint: CheckpointTensors, directory: str | os.PathLike
) -> None:
    """Raise `CheckpointError` when the parameters to be initialised (name -> shape) total more values than the
    checkpoint stores plus `NEW_PARAMETER_ALLOWANCE`: a config.json cannot make a load allocate much more memory
    than the checkpoint's files hold. Nothing is allocated to decide."""
    new = sum(math.prod(shape) for shape in shapes.values())
    stored = sum(tensor.numel() for tensor in checkpoint.tensors.values())
    if new <= stored + NEW_PARAMETER_ALLOWANCE:
        return
    largest = max(shapes, key=lambda name: math.prod(shapes[name]))
    raise CheckpointError(
        f"{Path(directory) / CONFIG_FILE}: the model it describes needs {new:,} values ({4 * new / 1e9:,.1f} GB in "
        f"fp32) that the checkpoint does not hold (the largest: {largest} of shape {shapes[largest]}); a load may "
        f"initialise at most {NEW_PARAMETER_ALLOWANCE:,} values beyond the {stored:,} stored. Check its sizes "
        f"(num_labels, hidden_size, vocab_size, ...)."
    )


# transformers' Auto class for each model class: the auto_map entry that would build it.
_AUTO_CLASSES = {
    "BertModel": "AutoModel",
    "BertForMaskedLM": "AutoModelForMaskedLM",
    "BertForPreTraining": "AutoModelForPreTraining",
    "BertForNextSentencePrediction": "AutoModelForNextSentencePrediction",
    "BertForSequenceClassification": "AutoModelForSequenceClassification",
    "BertForTokenClassification": "AutoModelForTokenClassification",
    "BertForQuestionAnswering": "AutoModelForQuestionAnswering",
    "BertForMultipleChoice": "AutoModelForMultipleChoice",
}


def _for_tokenizer(entry: Any) -> bool:
    return str(entry).startswith(("AutoTokenizer", "AutoProcessor"))


def without_model_auto_map(values: dict[str, Any]) -> dict[str, Any]:
    """config.json's `values` without the `auto_map` entries of models and configs (those of tokenizers stay): what
    a checkpoint loaded as plain BERT (`ignore_auto_map=True`) is, written out."""
    auto_map = values.get("auto_map")
    if auto_map is None:
        return values
    kept = {key: value for key, value in auto_map.items() if _for_tokenizer(key)} if isinstance(auto_map, dict) else {}
    values = {key: value for key, value in values.items() if key != "auto_map"}
    return {**values, "auto_map": kept} if kept else values


def check_auto_map(auto_map: Any, source: str, model_class: type | None = None) -> None:
    """CheckpointError when config.json's `auto_map` sends a model or its config to custom code (as
    jina-embeddings-v2 does, under `model_type: "bert"`): that code, not BERT, defines what the checkpoint computes,
    even where its tensor names match BERT's, and hfbert runs no code from a checkpoint. The error names the
    entry for `model_class` (else AutoModel, else AutoConfig, else the first) and the class it points to. Entries
    for tokenizers and processors only are no concern of the model."""
    if auto_map is None:
        return
    entries = auto_map if isinstance(auto_map, dict) else {"auto_map": auto_map}
    model_entries = [key for key in entries if not _for_tokenizer(key)]
    if not model_entries:
        return
    wanted = _AUTO_CLASSES.get(getattr(model_class, "__name__", ""), "AutoModel")
    key = next((name for name in (wanted, "AutoModel", "AutoConfig") if name in model_entries), model_entries[0])
    raise CheckpointError(
        f"{source}: field 'auto_map' maps {key} to custom code ({entries[key]!r}): this checkpoint defines its model "
        f"in its own code, which hfbert does not run, so it may compute something other than BERT even where its "
        f"tensors match. If you know its weights are plain BERT, load it with ignore_auto_map=True (hfbert CLI: "
        f"--ignore-auto-map)"
    )


def config_values(config: Any) -> dict[str, Any]:
    """config.json's contents from a config object: hfbert's `BertConfig` or transformers' (anything with
    `to_dict()`)."""
    if not callable(getattr(config, "to_dict", None)):
        raise TypeError(f"config must be a BertConfig (or a transformers config), not {type(config).__name__}")
    # Keys with a leading underscore are runtime state of transformers' configs, never config.json fields.
    return {key: value for key, value in config.to_dict().items() if not key.startswith("_")}


def model_heads(model: nn.Module) -> tuple[str, ...]:
    """The head prefixes a model loads: its declared `heads`, or, for a task model of the user's own (a subclass
    of `BertPreTrainedModel` written the transformers way, with the encoder at `bert` and no `heads`), the
    prefix of every other top-level submodule."""
    if model.heads or not model.base_prefix:
        return model.heads
    backbone = model.base_prefix.removesuffix(".")
    return tuple(f"{name}." for name, _ in model.named_children() if name != backbone)


def _new_head_parameters(report: LoadReport, model_heads: tuple[str, ...]) -> list[str]:
    """Missing parameters of heads the checkpoint has no tensor of at all (initialised, not an error)."""
    present = report.loaded + [name for name, _, _ in report.mismatched]
    new = []
    for head in model_heads:
        if not any(name.startswith(head) for name in present):
            new += [name for name in report.missing if name.startswith(head)]
    return new


def initial_value(name: str, shape: tuple[int, ...], config: Any, module: nn.Module | None = None) -> Tensor:
    """transformers' initialisation for a parameter the checkpoint lacks, by the kind of module that owns it (a
    user's own head may name its LayerNorm anything): LayerNorm weights one, biases zero, everything else
    normal(0, initializer_range), with an embedding's padding row zero."""
    is_norm = isinstance(module, nn.LayerNorm) or (module is None and name.endswith("LayerNorm.weight"))
    if is_norm and name.endswith("weight"):
        return torch.ones(shape)
    if name.endswith("bias"):
        return torch.zeros(shape)
    value = torch.empty(shape).normal_(mean=0.0, std=config.initializer_range)
    padding_row = module.padding_idx if isinstance(module, nn.Embedding) else None
    if padding_row is not None:
        value[padding_row] = 0.0
    return value


def _stored_dtype(state: dict[str, Tensor], checkpoint: CheckpointTensors) -> torch.dtype | None:
    dtypes = {tensor.dtype for tensor in state.values()}
    if len(dtypes) > 1:
        files = ", ".join(str(file) for file in checkpoint.files)
        raise CheckpointError(
            f"{files}: parameters are stored in several dtypes ({', '.join(sorted(map(str, dtypes)))}); pass dtype= "
            f"to from_pretrained to choose one"
        )
    return next(iter(dtypes), None)


def _strict_failure_message(directory: Path, report: LoadReport, checkpoint: CheckpointTensors) -> str:
    files = ", ".join(str(file) for file in checkpoint.files)
    shown = report.problems[:10]
    lines = [f"{files}: the checkpoint does not match the model built from {directory / CONFIG_FILE}:"]
    lines += [f"  - {line}" for line in shown]
    if len(report.problems) > len(shown):
        lines.append(f"  ... and {len(report.problems) - len(shown)} more")
    if report.missing and all(".pooler." in f".{name}" for name in report.missing):
        lines.append(
            "This checkpoint has no pooler (a masked-LM model is saved without one): load it with "
            "add_pooling_layer=False, or pass strict=False to initialise a new pooler, as transformers does."
        )
    for name in report.missing:
        head = name.removesuffix("decoder.bias")
        if name.endswith(".decoder.bias") and head + "bias" in report.loaded:
            lines.append(
                f"Checkpoints saved before transformers 5 with tie_word_embeddings false store the decoder's bias only "
                f"as '{head}bias' (the two were one tensor there); transformers 5 starts '{name}' from zeros. "
                f"Pass strict=False to load it so, then copy '{head}bias' into it to compute what such a checkpoint "
                f"computed before."
            )
    lines.append("Nothing was loaded. Pass strict=False to load anyway (missing parameters are then initialised).")
    return "\n".join(lines)
