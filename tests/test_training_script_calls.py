"""The calls real training scripts make, each run as the script runs it and compared with transformers doing the
same: `from_pretrained` by keyword and with `config=` (run_glue), `save_pretrained` with transformers' keywords
(accelerate's examples), outputs that accelerate's mixed precision walks, and task heads written the transformers
way (`BertPreTrainedModel.__init__(config)` ... `post_init()`).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import hfbert

from support.helpers import SMALL_CONFIG, max_difference, write_random_transformers_checkpoint

IDS = torch.tensor([[101, 7, 99, 512, 102, 0], [101, 42, 17, 102, 0, 0]])
MASK = (IDS != 0).long()


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """accelerate keeps one process-wide state; each test sets up its own Accelerator."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_transformers_checkpoint(tmp_path_factory.mktemp("small"), seed=3, **SMALL_CONFIG)


def encoded(model, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS, attention_mask=MASK, **kwargs).last_hidden_state


def test_from_pretrained_takes_transformers_parameter_name(checkpoint):
    import transformers

    ours = hfbert.BertModel.from_pretrained(pretrained_model_name_or_path=checkpoint)
    theirs = transformers.BertModel.from_pretrained(pretrained_model_name_or_path=checkpoint).eval()
    assert max_difference(encoded(ours), encoded(theirs), MASK.bool()) <= 1e-5
    config = hfbert.BertConfig.from_pretrained(pretrained_model_name_or_path=checkpoint)
    assert config.hidden_size == SMALL_CONFIG["hidden_size"]


def test_run_glue_style_load_with_a_config_object(checkpoint):
    """run_glue.py: `AutoConfig.from_pretrained(path, num_labels=..., finetuning_task=...)`, then
    `AutoModelForSequenceClassification.from_pretrained(path, config=config)`: the config object wins over
    config.json, the classifier is new, the encoder is the checkpoint's."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(checkpoint, num_labels=3, finetuning_task="mnli")
    theirs = transformers.BertForSequenceClassification.from_pretrained(checkpoint, config=config).eval()
    for given in (config, hfbert.BertConfig.from_pretrained(checkpoint, num_labels=3)):
        ours, info = hfbert.BertForSequenceClassification.from_pretrained(
            checkpoint, config=given, output_loading_info=True
        )
        assert ours.config.num_labels == 3 and ours.classifier.weight.shape == (3, SMALL_CONFIG["hidden_size"])
        assert sorted(info["missing_keys"]) == ["classifier.bias", "classifier.weight"]
        ours.classifier.load_state_dict(theirs.classifier.state_dict())
        with torch.no_grad():
            logits = ours(input_ids=IDS, attention_mask=MASK).logits
            expected = theirs(input_ids=IDS, attention_mask=MASK).logits
        assert (logits - expected).abs().max() <= 1e-5
    assert config.num_labels == 3 and config._attn_implementation != "eager"  # the caller's object, unchanged


def test_save_pretrained_takes_transformers_keywords(checkpoint, tmp_path):
    """accelerate's example scripts: `unwrapped.save_pretrained(out, is_main_process=..., save_function=
    accelerator.save)`; transformers' `state_dict`, `max_shard_size`, `safe_serialization` mean what they mean
    there, and what cannot apply is refused before anything is written."""
    import transformers
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = hfbert.BertModel.from_pretrained(checkpoint)
    model.save_pretrained(tmp_path / "not-main", is_main_process=False, save_function=accelerator.save)
    assert not (tmp_path / "not-main").exists()

    model.save_pretrained(tmp_path / "main", is_main_process=True, save_function=accelerator.save)
    theirs = transformers.BertModel.from_pretrained(tmp_path / "main").eval()
    assert max_difference(encoded(model), encoded(theirs), MASK.bool()) <= 1e-5

    saved = []
    model.save_pretrained(
        tmp_path / "bin",
        safe_serialization=False,
        save_function=lambda obj, path: saved.append(path) or torch.save(obj, path),
    )
    assert [path.name for path in saved] == ["pytorch_model.bin"]
    assert (
        max_difference(encoded(model), encoded(transformers.BertModel.from_pretrained(tmp_path / "bin")), MASK.bool())
        <= 1e-5
    )

    state = {name: tensor * 2 for name, tensor in model.state_dict().items()}
    model.save_pretrained(tmp_path / "state", state_dict=state, max_shard_size="200KB")
    assert (tmp_path / "state" / "model.safetensors.index.json").is_file()
    reloaded = hfbert.BertModel.from_pretrained(tmp_path / "state")
    assert all(torch.equal(reloaded.state_dict()[name], tensor) for name, tensor in state.items())

    for refused in (dict(push_to_hub=True), dict(variant="fp16"), dict(distributed_checkpoint=True), dict(colour=1)):
        name = next(iter(refused))
        with pytest.raises(TypeError, match=f"save_pretrained: {name}="):
            model.save_pretrained(tmp_path / "refused", **refused)
        assert not (tmp_path / "refused").exists()


def test_outputs_behave_like_transformers_model_output(checkpoint):
    import transformers

    ours = hfbert.BertForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    theirs = transformers.BertForSequenceClassification.from_pretrained(checkpoint, num_labels=2).eval()
    with torch.no_grad():
        outputs = [model(input_ids=IDS, attention_mask=MASK, labels=torch.tensor([0, 1])) for model in (ours, theirs)]
    ours_out, theirs_out = outputs
    from collections.abc import Mapping

    assert isinstance(ours_out, Mapping) and isinstance(theirs_out, Mapping)
    assert list(ours_out.keys()) == list(theirs_out.keys()) == ["loss", "logits"]  # None fields left out
    assert len(ours_out.to_tuple()) == len(theirs_out.to_tuple()) == 2
    assert ours_out[1] is ours_out["logits"] is ours_out.logits
    rebuilt = type(ours_out)({key: value for key, value in ours_out.items()})  # how accelerate rebuilds outputs
    assert type(rebuilt) is type(ours_out) and list(rebuilt.keys()) == ["loss", "logits"]


def test_accelerate_mixed_precision_returns_fp32_logits_as_for_transformers(checkpoint):
    import transformers
    from accelerate import Accelerator

    logits = []
    for model in (
        hfbert.BertForSequenceClassification.from_pretrained(checkpoint, num_labels=2),
        transformers.BertForSequenceClassification.from_pretrained(checkpoint, num_labels=2),
    ):
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
        accelerator = Accelerator(cpu=True, mixed_precision="bf16")
        torch.manual_seed(0)
        model.classifier.reset_parameters()
        prepared = accelerator.prepare(model).eval()
        with torch.no_grad():
            logits.append(prepared(input_ids=IDS, attention_mask=MASK).logits)
    ours, theirs = logits
    assert ours.dtype == theirs.dtype == torch.float32
    ours.numpy()  # what failed while the logits stayed bf16
    assert (ours - theirs).abs().max() <= 0.05 * theirs.abs().max()  # bf16 autocast rounding, both sides


def make_custom_head(base_class, bert_class, linear=nn.Linear):
    class Scorer(base_class):
        """A task model written the transformers way: encoder at `bert`, a head of its own, `post_init()`."""

        def __init__(self, config):
            super().__init__(config)
            self.bert = bert_class(config, add_pooling_layer=False)
            self.scorer = linear(config.hidden_size, 1)
            self.norm = nn.LayerNorm(config.hidden_size)
            self.post_init()

        def forward(self, input_ids=None, attention_mask=None):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return self.scorer(self.norm(hidden[:, 0])).squeeze(-1)

    return Scorer


def test_a_custom_head_written_the_transformers_way_loads_trains_and_saves(checkpoint, tmp_path):
    import transformers

    ours_class = make_custom_head(hfbert.BertPreTrainedModel, hfbert.BertModel)
    theirs_class = make_custom_head(transformers.BertPreTrainedModel, transformers.BertModel)
    built = ours_class(hfbert.BertConfig(**SMALL_CONFIG))
    assert torch.equal(built.norm.weight, torch.ones(SMALL_CONFIG["hidden_size"]))  # initialised by post_init
    ours, info = ours_class.from_pretrained(checkpoint, output_loading_info=True)
    theirs = theirs_class.from_pretrained(checkpoint).eval()
    assert sorted(info["missing_keys"]) == ["norm.bias", "norm.weight", "scorer.bias", "scorer.weight"]
    assert torch.equal(ours.norm.weight, torch.ones_like(ours.norm.weight)) and not ours.scorer.bias.any()
    assert max_difference(encoded(ours.bert), encoded(theirs.bert), MASK.bool()) <= 1e-5
    ours.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        assert (ours(IDS, MASK) - theirs(IDS, MASK)).abs().max() <= 1e-5
    ours.save_pretrained(tmp_path)
    assert "scorer.weight" in load_file(tmp_path / "model.safetensors")
    again = ours_class.from_pretrained(tmp_path)  # strict: every tensor, the head's included, comes back
    assert all(torch.equal(again.state_dict()[name], tensor) for name, tensor in ours.state_dict().items())
    assert torch.equal(theirs_class.from_pretrained(tmp_path).scorer.weight, ours.scorer.weight)


def test_post_init_keeps_resized_untied_embeddings_as_transformers_does():
    import transformers

    for library in (hfbert, transformers):
        config = library.BertConfig(**SMALL_CONFIG, tie_word_embeddings=False)
        model = library.BertForMaskedLM(config).eval()
        model.resize_token_embeddings(SMALL_CONFIG["vocab_size"] + 10)
        before = model.get_output_embeddings().weight.detach().clone()
        model.post_init()
        assert torch.equal(model.get_output_embeddings().weight, before), library.__name__


def test_checkpoint_error_is_caught_as_runtime_error_too(tmp_path, checkpoint):
    import shutil

    shutil.copytree(checkpoint, tmp_path / "c")
    state = load_file(tmp_path / "c" / "model.safetensors")
    state.pop(next(iter(state)))
    from safetensors.torch import save_file

    save_file(state, tmp_path / "c" / "model.safetensors")
    for expected in (RuntimeError, ValueError, hfbert.CheckpointError):
        with pytest.raises(expected, match="missing"):
            hfbert.BertModel.from_pretrained(tmp_path / "c")


@pytest.mark.parametrize("class_name", ["BertModel", "BertForSequenceClassification", "BertForMaskedLM"])
def test_models_are_built_from_a_transformers_config(class_name):
    """transformers' own model tests build models from `transformers.BertConfig` objects."""
    import transformers

    config = transformers.BertConfig(**SMALL_CONFIG, num_labels=3)
    theirs = getattr(transformers, class_name)(config).eval()
    ours = getattr(hfbert, class_name)(config).eval()
    ours.load_state_dict(theirs.state_dict(), strict=False)
    ours.tie_weights()
    with torch.no_grad():
        expected, got = (model(input_ids=IDS, attention_mask=MASK)[0] for model in (theirs, ours))
    assert isinstance(ours.config, hfbert.BertConfig)
    positions = MASK.bool() if got.dim() == 3 else None  # hidden states and MLM logits: real tokens only
    assert max_difference(got, expected, positions) <= 1e-5
