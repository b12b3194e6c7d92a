"""`BertPreTrainedModel`: what every hfbert model shares with transformers' models, in one place.

Loading (`from_pretrained`), saving (`save_pretrained`), weight tying, embedding access and resizing, parameter
counts, device / dtype, gradient checkpointing. The models themselves (`model.py`, `heads.py`) only build
modules and define `forward`.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import torch
from torch import nn

from hfbert.attention import DEFAULT_ATTENTION, check_attention_implementation
from hfbert.config import BertConfig


class BertPreTrainedModel(nn.Module):
    # Where the encoder lives in the state dict ("bert." in the task models, as in transformers).
    base_prefix: ClassVar[str] = "bert."
    # The task heads this model has, as `converters.key_map.HEADS` prefixes; others are ignored when loading.
    heads: ClassVar[tuple[str, ...]] = ()
    config: BertConfig
    name_or_path: str = ""

    @property
    def backbone(self) -> nn.Module:
        """The `BertModel` inside (the model itself for `BertModel`)."""
        return self.bert

    # -- initialisation ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self) -> None:
        """transformers' initialisation: Linear and Embedding weights normal(0, initializer_range), biases zero,
        the padding embedding row zero, LayerNorm ones / zeros. Skipped on the meta device, where
        `from_pretrained` builds models whose every parameter comes from the checkpoint."""
        if any(parameter.is_meta for parameter in self.parameters()):
            return
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(mean=0.0, std=std)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
            bias = getattr(module, "bias", None)
            if isinstance(bias, nn.Parameter):
                bias.zero_()
        self.tie_weights()

    # -- weight tying ------------------------------------------------------------------------------------------
    def tied_weights(self) -> dict[str, str]:
        """Parameters that are the same tensor as another: name -> the name it is tied to."""
        return {}

    def tie_weights(self) -> None:
        for name, source in self.tied_weights().items():
            module_name, _, attribute = name.rpartition(".")
            setattr(self.get_submodule(module_name), attribute, self.get_parameter(source))

    # -- embeddings --------------------------------------------------------------------------------------------
    def get_input_embeddings(self) -> nn.Embedding:
        return self.backbone.embeddings.word_embeddings

    def set_input_embeddings(self, embeddings: nn.Embedding) -> None:
        self.backbone.embeddings.word_embeddings = embeddings
        self.tie_weights()

    def resize_token_embeddings(self, new_num_tokens: int) -> nn.Embedding:
        """Grow or shrink the vocabulary; kept rows are copied, new rows initialised as transformers does."""
        old = self.get_input_embeddings()
        if new_num_tokens <= 0:
            raise ValueError(f"new_num_tokens must be positive, got {new_num_tokens}")
        padding_idx = old.padding_idx if old.padding_idx is not None and old.padding_idx < new_num_tokens else None
        new = nn.Embedding(new_num_tokens, old.embedding_dim, padding_idx=padding_idx)
        new.to(device=old.weight.device, dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight.normal_(mean=0.0, std=self.config.initializer_range)
            kept = min(new_num_tokens, old.num_embeddings)
            new.weight[:kept] = old.weight[:kept]
        self.config.vocab_size = new_num_tokens
        self.resize_output_bias(new_num_tokens)
        self.set_input_embeddings(new)
        return new

    def resize_output_bias(self, new_num_tokens: int) -> None:
        """Models with an output layer over the vocabulary resize its bias here."""

    # -- conveniences a transformers user reaches for ---------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

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

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each layer in the backward pass (always non-reentrant, so no warnings and DDP-safe)."""
        self.backbone.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.backbone.gradient_checkpointing = False

    # -- loading and saving ------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | os.PathLike,
        *,
        revision: str | None = None,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        attn_implementation: str | None = None,
        strict: bool = True,
        output_loading_info: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Load a BERT checkpoint from a local directory or a Hub repo id, in eval mode.

        The model is built on the meta device and its parameters are assigned the (memory-mapped) checkpoint
        tensors: no random initialisation and no second copy. `dtype=None` keeps the stored dtype. With
        `strict=True` (default) every parameter must come from the checkpoint with the right shape, otherwise
        `converters.CheckpointError` says which; a task head the checkpoint has no tensor of (a new classifier)
        is initialised and reported. Keyword arguments that name config fields override config.json
        (`num_labels=3`); others go to the constructor (`add_pooling_layer=False`).
        `output_loading_info=True` returns `(model, info)` with transformers' keys plus `info["report"]`.

            >>> model = BertModel.from_pretrained("google-bert/bert-base-uncased")  # doctest: +SKIP
            >>> model, info = BertModel.from_pretrained("./my-bert", output_loading_info=True)  # doctest: +SKIP
            >>> print(info["report"])  # doctest: +SKIP
        """
        from converters.loading import load_pretrained

        return load_pretrained(
            cls,
            path_or_repo_id,
            revision=revision,
            dtype=dtype,
            device=device,
            attn_implementation=attn_implementation or DEFAULT_ATTENTION,
            strict=strict,
            output_loading_info=output_loading_info,
            **kwargs,
        )

    def save_pretrained(
        self, save_directory: str | os.PathLike, safe_serialization: bool = True, max_shard_size: str | int = "5GB"
    ) -> None:
        """Write the Hugging Face layout (config.json, safetensors or shards + index, tokenizer files of the
        checkpoint this model came from), atomically; tied weights are stored once.

            >>> model.save_pretrained("my-bert")  # doctest: +SKIP
        """
        from converters.saving import save_model

        save_model(self, save_directory, safe_serialization=safe_serialization, max_shard_size=max_shard_size)
