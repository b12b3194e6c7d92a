"""`BertPreTrainedModel`: what every hfbert model shares with transformers' models, in one place.

Loading (`from_pretrained`), saving (`save_pretrained`), weight tying, embedding access and resizing, parameter
counts, device / dtype, gradient checkpointing. The models themselves (`model.py`, `heads.py`) only build
modules and define `forward`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import nn

from converters.dtypes import as_dtype
from converters.key_map import BERT_KEYS, KeyLayout
from converters.loading import check_requested_dtype
from hfbert.modeling.attention import DEFAULT_ATTENTION, check_attention_implementation
from hfbert.modeling.checkpointing import Checkpointing
from hfbert.modeling.config import BertConfig, EncoderConfig
from hfbert.platform.cpu import warn_if_emulated_bfloat16


class BertPreTrainedModel(nn.Module):
    # Where the encoder lives in the state dict ("bert." in the task models, as in transformers).
    base_prefix: ClassVar[str] = "bert."
    # The task heads this model has, as prefixes of its family's `key_layout.heads`; others are ignored when loading.
    heads: ClassVar[tuple[str, ...]] = ()
    # How the checkpoints of this model's family name their tensors: its config class's (`BertConfig.key_layout`).
    key_layout: ClassVar[KeyLayout] = BERT_KEYS
    config: EncoderConfig
    name_or_path: str = ""
    # Ties of `tied_weights()` the loaded checkpoint breaks (it stores both tensors, with different values): left
    # apart, as transformers leaves them, and saved apart.
    _untied_weights: frozenset[str] = frozenset()
    # transformers' `PreTrainedModel` class attributes that Trainer, PEFT, accelerate and transformers' own model
    # tests read, with the values transformers' BERT classes have.
    config_class: ClassVar[type[EncoderConfig]] = BertConfig
    base_model_prefix: ClassVar[str] = "bert"
    main_input_name: ClassVar[str] = "input_ids"
    supports_gradient_checkpointing: ClassVar[bool] = True
    _supports_sdpa: ClassVar[bool] = True
    _supports_flash_attn: ClassVar[bool] = False
    _supports_flex_attn: ClassVar[bool] = False
    _keep_in_fp32_modules: ClassVar[list[str] | None] = None
    _keys_to_ignore_on_save: ClassVar[list[str] | None] = None
    _keys_to_ignore_on_load_missing: ClassVar[list[str] | None] = None
    _keys_to_ignore_on_load_unexpected: ClassVar[list[str] | None] = None
    # The losses are batch means and take no `num_items_in_batch`: the Trainer divides them over gradient
    # accumulation steps itself. Stated, not left to the Trainer's reading of **kwargs in a forward (MPNet's has one).
    accepts_loss_kwargs: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "key_layout" not in cls.__dict__:  # a member's model reads its checkpoints as its config class says
            cls.key_layout = cls.config_class.key_layout

    def __init__(self, config: EncoderConfig | None = None, *inputs: Any, **kwargs: Any) -> None:
        """`config` is kept as `self.config`, as transformers' `PreTrainedModel.__init__(config)` does, so a task
        model of your own is written the transformers way:

            >>> class MyHead(BertPreTrainedModel):  # doctest: +SKIP
            ...     def __init__(self, config):
            ...         super().__init__(config)
            ...         self.bert = BertModel(config, add_pooling_layer=False)
            ...         self.scorer = nn.Linear(config.hidden_size, 1)
            ...         self.post_init()
        """
        super().__init__()
        if config is not None:
            self.config = config if isinstance(config, EncoderConfig) else EncoderConfig.from_object(config)

    def post_init(self) -> None:
        """transformers' last constructor step: initialise the parameters of every module not initialised yet
        (`_init_weights`; loaded and resized ones keep their values, as in transformers) and tie weights."""
        self.init_weights()

    @property
    def backbone(self) -> nn.Module:
        """The `BertModel` inside (the model itself for `BertModel`), at `base_model_prefix` as in transformers:
        `model.bert`, `model.roberta`."""
        return getattr(self, self.base_model_prefix)

    @property
    def base_model(self) -> nn.Module:
        """transformers' name for `backbone`."""
        return self.backbone

    @classmethod
    def can_generate(cls) -> bool:
        """BERT is an encoder: no `generate()` (transformers asks before setting up generation)."""
        return False

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        # Both kernels can be swapped at any time (`set_attn_implementation`).
        return True

    @classmethod
    def _can_set_experts_implementation(cls) -> bool:
        # transformers asks before switching mixture-of-experts kernels; BERT has none.
        return False

    @classmethod
    def _from_config(cls, config: EncoderConfig, **kwargs: Any) -> BertPreTrainedModel:
        """transformers' constructor hook: a randomly initialised model for `config`; `dtype` casts it."""
        dtype, torch_dtype = kwargs.pop("dtype", None), kwargs.pop("torch_dtype", None)
        dtype = as_dtype(dtype or torch_dtype)
        check_requested_dtype(dtype)  # as from_pretrained: fp8 would build a model no forward runs
        model = cls(config, **kwargs)
        return model.to(dtype) if dtype is not None else model

    def get_output_embeddings(self) -> nn.Module | None:
        """The layer that produces vocabulary logits; None for models without one (as in transformers)."""
        return None

    # -- initialisation ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self) -> None:
        """transformers' initialisation: Linear and Embedding weights normal(0, initializer_range), biases zero,
        the padding embedding row zero, LayerNorm ones / zeros. Skipped on the meta device, where
        `from_pretrained` builds models whose every parameter comes from the checkpoint."""
        if any(parameter.is_meta for parameter in self.parameters()):
            return
        for module in self.modules():
            if not getattr(module, "_is_hf_initialized", False):
                self._init_weights(module)
        mark_initialized(self)
        self.tie_weights()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """transformers' per-module initialisation hook, with the values of its BERT."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(mean=0.0, std=std)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            module.weight[module.padding_idx].zero_()
        if isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
        bias = module._parameters.get("bias")
        if isinstance(bias, nn.Parameter):
            bias.zero_()

    # -- weight tying ------------------------------------------------------------------------------------------
    def tied_weights(self) -> dict[str, str]:
        """Parameters that are the same tensor as another: name -> the name it is tied to."""
        return {}

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        # transformers' name for `tied_weights()` (tied parameter -> its source), read by its tools and tests.
        return self.tied_weights()

    def tie_weights(self) -> None:
        """Make every parameter of `tied_weights()` the very tensor it is tied to (after a load or a resize)."""
        for name, source in self.tied_weights().items():
            module_name, _, attribute = name.rpartition(".")
            setattr(self.get_submodule(module_name), attribute, self.get_parameter(source))

    # -- embeddings --------------------------------------------------------------------------------------------
    def get_input_embeddings(self) -> nn.Embedding:
        return self.backbone.embeddings.word_embeddings

    def set_input_embeddings(self, embeddings: nn.Embedding) -> None:
        self.backbone.embeddings.word_embeddings = embeddings
        self.tie_weights()
        if getattr(self, "_input_require_grads_hook", None) is not None:  # the hook follows the new module
            self.disable_input_require_grads()
            self.enable_input_require_grads()

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Grow or shrink the vocabulary, as transformers does: kept rows are copied; added rows are the mean of the
        old rows (`mean_resizing=True`, transformers' default) or normal(0, initializer_range); an output layer over
        the vocabulary follows. `pad_to_multiple_of` rounds the size up; with neither argument nothing changes."""
        old = self.get_input_embeddings()
        if new_num_tokens is None and pad_to_multiple_of is None:
            return old
        if new_num_tokens is None:
            new_num_tokens = old.num_embeddings
        if pad_to_multiple_of is not None:
            if not isinstance(pad_to_multiple_of, int):
                # transformers' words, its typo included, so that code matching its message matches this one
                raise ValueError(
                    f"Asking to pad the embedding matrix to a multiple of `{pad_to_multiple_of}`, which is not and "
                    "integer. Please make sure to pass an integer"
                )
            if pad_to_multiple_of <= 0:
                raise ValueError(f"pad_to_multiple_of must be a positive integer, got {pad_to_multiple_of!r}")
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        if new_num_tokens <= 0:
            raise ValueError(f"new_num_tokens must be positive, got {new_num_tokens}")
        padding_idx = old.padding_idx if old.padding_idx is not None and old.padding_idx < new_num_tokens else None
        new = nn.Embedding(new_num_tokens, old.embedding_dim, padding_idx=padding_idx)
        new.to(device=old.weight.device, dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(resized_rows(old.weight, new_num_tokens, mean_resizing, self.config.initializer_range))
        new.requires_grad_(old.weight.requires_grad)
        new._is_hf_initialized = True
        self.config.vocab_size = new_num_tokens
        self.resize_output_layer(new_num_tokens, mean_resizing)
        self.set_input_embeddings(new)
        return new

    def resize_output_layer(self, new_num_tokens: int, mean_resizing: bool) -> None:
        """Models with an output layer over the vocabulary resize it here."""

    # -- conveniences a transformers user reaches for ---------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters counted once even when tied (as transformers counts them)."""
        embeddings = {id(module.weight) for module in self.modules() if isinstance(module, nn.Embedding)}
        return sum(
            parameter.numel()
            for parameter in self.parameters()
            if (parameter.requires_grad or not only_trainable)
            and not (exclude_embeddings and id(parameter) in embeddings)
        )

    def set_attn_implementation(self, name: str) -> None:
        self.backbone.attn_implementation = check_attention_implementation(name)

    # -- gradient (activation) checkpointing, with the signatures Trainer and PEFT call --------------------------
    def activation_checkpointing_enable(
        self, activation_checkpointing_kwargs: dict | None = None, every_n_layers: int = 1, offload: bool = False
    ) -> None:
        """Recompute encoder layers in the backward pass instead of keeping their activations.

        As transformers: `activation_checkpointing_kwargs` go to `torch.utils.checkpoint.checkpoint` (default
        `{"use_reentrant": False}`: no warnings, DDP-safe, same gradients); `every_n_layers` checkpoints layers
        0, n, 2n, ...; `offload` keeps the saved layer inputs in (pinned) host memory. The word embeddings' output
        is made to require grad, so that gradients reach trainable layers behind frozen embeddings (PEFT) and the
        reentrant variant works.
        """
        self.backbone.checkpointing = Checkpointing(
            enabled=True,
            every_n_layers=every_n_layers,
            offload=offload,
            kwargs={"use_reentrant": False, **(activation_checkpointing_kwargs or {})},
        )
        self.enable_input_require_grads()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None, **kwargs: Any) -> None:
        """transformers' older name for `activation_checkpointing_enable` (Trainer and PEFT still call it);
        `kwargs` are `every_n_layers` and `offload`."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def activation_checkpointing_disable(self) -> None:
        # The input-grad hook stays, as in transformers: PEFT may have asked for it too, and it costs nothing.
        backbone = self.backbone
        backbone.checkpointing = replace(backbone.checkpointing, enabled=False)

    def gradient_checkpointing_disable(self) -> None:
        self.activation_checkpointing_disable()

    @property
    def is_activation_checkpointing(self) -> bool:
        return self.backbone.checkpointing.enabled

    @property
    def is_gradient_checkpointing(self) -> bool:
        """transformers' older name for `is_activation_checkpointing` (PEFT reads it)."""
        return self.is_activation_checkpointing

    def enable_input_require_grads(self) -> None:
        """Make the word embeddings' output require grad (a forward hook), so that gradients flow back through a
        model whose embeddings are frozen, as PEFT adapters and reentrant checkpointing need."""
        if getattr(self, "_input_require_grads_hook", None) is None:
            self._input_require_grads_hook = self.get_input_embeddings().register_forward_hook(_require_grad)

    def disable_input_require_grads(self) -> None:
        hook = getattr(self, "_input_require_grads_hook", None)
        if hook is not None:
            hook.remove()
            self._input_require_grads_hook = None

    # -- loading and saving ------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *model_args: Any,
        config: Any = None,
        revision: str | None = None,
        dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        attn_implementation: str | None = None,
        strict: bool = True,
        output_loading_info: bool = False,
        ignore_mismatched_sizes: bool = False,
        torch_dtype: torch.dtype | str | None = None,
        subfolder: str = "",
        **kwargs: Any,
    ) -> Any:
        """Load a BERT checkpoint from a local directory or a Hub repo id, in eval mode.

        The model is built on the meta device and its parameters are assigned the (memory-mapped) checkpoint
        tensors: no random initialisation and no second copy. `dtype=None` (or "auto") keeps the stored dtype;
        a dtype or its name ("bfloat16") casts. With `strict=True` (default) every parameter must come from the
        checkpoint with the right shape, otherwise `hfbert.CheckpointError` says which (`strict=False` initialises
        what is missing, as transformers does); a task head the checkpoint has no tensor of (a new classifier) is
        initialised and reported. `ignore_mismatched_sizes=True` (transformers' option) initialises afresh the
        parameters whose shape differs from the checkpoint's (re-heading a classifier: `num_labels=7`), reports them
        as mismatched and reinitialised, and warns on the "hfbert" logger, naming them and both shapes.

        Ties follow `tie_word_embeddings` as in transformers 5: a masked LM's decoder weight and bias are the word
        embeddings and the head's `bias` only when it is true, and a tie whose two tensors the checkpoint stores
        with different values is not made (a warning says so). A path or repo id where there is no checkpoint raises
        `CheckpointNotFoundError`, a `CheckpointError` that is also an `OSError`. `subfolder` is the checkpoint's
        folder inside the directory or repo, as in transformers.

        `config` (a member's config such as `BertConfig`, or transformers' own) is used instead of config.json, as in
        transformers (`run_glue.py` re-heads a model this way). Keyword arguments that name config fields override
        the config (`num_labels=3`); `model_args` and other keywords go to the constructor (`add_pooling_layer=False`).
        `torch_dtype` is transformers' older name for `dtype`. A config.json whose `auto_map` sends the model to
        custom code is refused (hfbert runs no checkpoint code); `ignore_auto_map=True` loads it as plain BERT when
        you know its weights are.
        `output_loading_info=True` returns `(model, info)` with transformers' keys plus `info["report"]`.

            >>> model = BertModel.from_pretrained("google-bert/bert-base-uncased")  # doctest: +SKIP
            >>> model, info = BertModel.from_pretrained("./my-bert", output_loading_info=True)  # doctest: +SKIP
            >>> print(info["report"])  # doctest: +SKIP
        """
        from converters.load_report import ignoring_mismatched_sizes
        from converters.loading import load_pretrained

        with ignoring_mismatched_sizes(ignore_mismatched_sizes):
            loaded = load_pretrained(
                cls,
                pretrained_model_name_or_path,
                revision=revision,
                dtype=as_dtype(dtype or torch_dtype),
                device=device,
                attn_implementation=check_attention_implementation(attn_implementation or DEFAULT_ATTENTION),
                strict=strict,
                output_loading_info=output_loading_info,
                config=config,
                model_args=model_args,
                subfolder=subfolder,
                **kwargs,
            )
        mark_initialized(loaded[0] if output_loading_info else loaded)
        warn_if_emulated_bfloat16(loaded[0] if output_loading_info else loaded, stacklevel=2)
        return loaded

    def _apply(self, fn, recurse=True):
        # .to(), .bfloat16(), .half(), .cpu() all come through here: a cast to bf16 on a CPU that emulates it warns.
        result = super()._apply(fn, recurse)
        warn_if_emulated_bfloat16(self, stacklevel=3)  # past torch's .to() to the caller's line
        return result

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        is_main_process: bool = True,
        state_dict: dict[str, torch.Tensor] | None = None,
        save_function: Any = None,
        push_to_hub: bool = False,
        max_shard_size: str | int = "5GB",
        safe_serialization: bool = True,
        variant: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Write the Hugging Face layout (config.json, safetensors or shards + index, tokenizer files of the
        checkpoint this model came from), atomically; tied weights are stored once.

        Into an existing folder only config.json and the weights are replaced; tokenizer files there are kept (the
        checkpoint's are copied only into a folder with none). When the kept or copied tokenizer does not go with
        this model (another vocabulary than the checkpoint's, or ids past `config.vocab_size`), a UserWarning names
        the files and the way out.

        transformers' keywords mean what they mean there: `is_main_process=False` writes nothing (every rank may
        call it); `state_dict` is saved instead of the model's own (keys as `state_dict()` names them);
        `safe_serialization=False` writes `pytorch_model.bin` through `save_function(obj, path)` (default
        `torch.save`; as in transformers it is not used for safetensors); `max_shard_size` splits safetensors
        shards. `token`, `save_peft_format` and `save_original_format` are accepted and change nothing here (no
        upload, no adapters, one format). What hfbert cannot do is refused before anything is written:
        `push_to_hub=True` (save, then `huggingface_hub.upload_folder`), a `variant`, `distributed_checkpoint=True`,
        and any other keyword.

            >>> model.save_pretrained("my-bert")  # doctest: +SKIP
        """
        from converters.saving import save_model

        refused = {name: value for name, value in kwargs.items() if name not in _SAVE_KEYWORDS_WITHOUT_EFFECT}
        if kwargs.get("distributed_checkpoint"):
            refused["distributed_checkpoint"] = True
        if push_to_hub:
            refused["push_to_hub"] = True
        if variant is not None:
            refused["variant"] = variant
        if refused:
            raise TypeError(
                f"save_pretrained: {', '.join(f'{name}={value!r}' for name, value in refused.items())} not supported "
                "by hfbert (it writes one local checkpoint in the Hugging Face layout; to upload it, save it, then "
                "huggingface_hub.upload_folder)"
            )
        if not is_main_process:
            return
        save_model(
            self,
            save_directory,
            safe_serialization=safe_serialization,
            max_shard_size=max_shard_size,
            state_dict=state_dict,
            save_function=save_function,
        )


# transformers' save_pretrained keywords that concern uploads, adapters or legacy formats: nothing to do here.
_SAVE_KEYWORDS_WITHOUT_EFFECT = frozenset(
    {"token", "save_peft_format", "save_original_format", "distributed_checkpoint"}
)


def mark_initialized(model: nn.Module) -> None:
    """Flag every module as holding its final values (transformers' `_is_hf_initialized`): `post_init` leaves them."""
    for module in model.modules():
        module._is_hf_initialized = True


def _require_grad(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
    # Only when autograd records: under no_grad / inference_mode there is nothing to flow back (and inference
    # tensors refuse requires_grad).
    if torch.is_grad_enabled() and output.is_floating_point():
        output.requires_grad_(True)


@torch.no_grad()
def resized_rows(old: torch.Tensor, rows: int, mean_resizing: bool, std: float) -> torch.Tensor:
    """`old` cut or grown to `rows` rows: kept rows copied; added rows the mean of the old ones (transformers'
    `mean_resizing` samples around that mean with 1e-9 of their covariance, which is the mean to fp32 precision),
    else normal(0, std), or zeros when std is 0 (a bias)."""
    new = torch.empty((rows, *old.shape[1:]), device=old.device, dtype=old.dtype)
    kept = min(rows, old.shape[0])
    new[:kept] = old[:kept]
    if mean_resizing:
        new[kept:] = old.float().mean(dim=0).to(old.dtype)
    elif std > 0:
        new[kept:].normal_(mean=0.0, std=std)
    else:
        new[kept:].zero_()
    return new
