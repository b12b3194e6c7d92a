"""A checkpoint's sentence-transformers files (modules.json, sentence_bert_config.json, the Pooling and Dense
folders, config_sentence_transformers.json) read as sentence-transformers reads them: the embeddings equal its
`encode` element-wise where it runs the pipeline, and what it refuses or cannot build is refused, naming the file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import hfbert

from support.helpers import minilm_directory
from support.robust import DEEP_JSON, assert_one_line, run

ST_TEXTS = ["", "Yes.", "A [MASK] in the text.", "A longer sentence, about something else entirely.", "x [SEP] y"]


def save_sentence_transformer(backbone: Path, directory: Path, *extra, pooling="mean", prompt=None) -> Path:
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    modules = [Transformer(str(backbone)), Pooling(32, pooling_mode=pooling), *extra]
    prompts = {"query": prompt} if prompt else None
    model = st.SentenceTransformer(
        modules=modules, device="cpu", prompts=prompts, default_prompt_name="query" if prompt else None
    )
    model.save(str(directory))
    return directory


def compare_with_sentence_transformers(directory: Path, texts=ST_TEXTS) -> float:
    from sentence_transformers import SentenceTransformer

    from hfbert.tools.embedding import Embedder

    expected = SentenceTransformer(str(directory), device="cpu").encode(texts, convert_to_numpy=True)
    ours = Embedder(directory).embed(texts).numpy()
    assert ours.shape == expected.shape
    return float(np.abs(ours - expected).max())


# -- pooling, Dense and lower-casing as sentence-transformers runs them ---------------------------------------------


@pytest.mark.parametrize("activation", ["PReLU", "RReLU"])
def test_a_dense_activation_with_state_runs_as_sentence_transformers_runs_it(sentence_backbone, tmp_path, activation):
    from sentence_transformers.base.modules import Dense

    from hfbert.tools.embedding import Embedder

    torch.manual_seed(1)
    dense = Dense(32, 16, activation_function=getattr(torch.nn, activation)())
    if activation == "PReLU":
        with torch.no_grad():
            dense.activation_function.weight.fill_(-1.5)  # far from PReLU's initial 0.25
    directory = save_sentence_transformer(sentence_backbone, tmp_path / "st", dense)
    assert compare_with_sentence_transformers(directory) <= 1e-5
    embedder = Embedder(directory)
    assert torch.equal(embedder.embed(ST_TEXTS), embedder.embed(ST_TEXTS))  # RReLU in eval mode: deterministic


def test_legacy_pooling_flags_are_read_by_truthiness(sentence_backbone, tmp_path):
    directory = save_sentence_transformer(sentence_backbone, tmp_path / "st", pooling="cls")
    modules = json.loads((directory / "modules.json").read_text())
    pooling_folder = directory / next(module["path"] for module in modules if module["type"].endswith("Pooling"))
    legacy = {"word_embedding_dimension": 32, "pooling_mode_cls_token": 1, "pooling_mode_mean_tokens": 0}
    (pooling_folder / "config.json").write_text(json.dumps(legacy))
    assert compare_with_sentence_transformers(directory) <= 1e-5


@pytest.mark.parametrize(("do_lower_case", "include_prompt"), [(True, True), (1, 0)])
def test_do_lower_case_lowercases_after_special_tokens_are_split_off(
    sentence_backbone, tmp_path, do_lower_case, include_prompt
):
    directory = save_sentence_transformer(sentence_backbone, tmp_path / "st", prompt="Query [MASK]: ")
    config = json.loads((directory / "sentence_bert_config.json").read_text())
    (directory / "sentence_bert_config.json").write_text(json.dumps({**config, "do_lower_case": do_lower_case}))
    pooling = next(directory.glob("*_Pooling")) / "config.json"
    pooling_config = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**pooling_config, "include_prompt": include_prompt}))  # 0: left out, by truthiness
    assert compare_with_sentence_transformers(directory, [*ST_TEXTS, "ÀÉÎ [MASK] Õü [CLS]"]) <= 1e-5


# -- Dense weights and activations checked as the encoder's ---------------------------------------------------------


def dense_checkpoint(backbone: Path, directory: Path) -> Path:
    from sentence_transformers.base.modules import Dense

    torch.manual_seed(1)
    save_sentence_transformer(backbone, directory, Dense(32, 16))
    return next(directory.glob("*_Dense"))


@pytest.mark.parametrize("tensor", ["broadcast", "meta"])
def test_dense_weights_get_the_checks_of_the_encoder_weights(sentence_backbone, tmp_path, tensor):
    from hfbert.tools.embedding import Embedder

    dense = dense_checkpoint(sentence_backbone, tmp_path / "st")
    from safetensors.torch import load_file

    state = load_file(dense / "model.safetensors")
    if tensor == "broadcast":  # a few bytes that claim 16 x 32 values
        state["linear.weight"] = torch.full((1,), 0.5, dtype=torch.float16).expand(16, 32)
    else:
        state["linear.weight"] = torch.empty(16, 32, device="meta")
    (dense / "model.safetensors").unlink()
    torch.save(state, dense / "pytorch_model.bin")
    with pytest.raises(
        hfbert.CheckpointError, match=r"pytorch_model\.bin: tensor 'linear\.weight' (of shape .* claims|is a meta)"
    ):
        Embedder(tmp_path / "st")


def test_an_unexpected_dense_tensor_is_refused_as_sentence_transformers_refuses_it(sentence_backbone, tmp_path):
    from safetensors.torch import load_file, save_file

    from hfbert.tools.embedding import Embedder

    dense = dense_checkpoint(sentence_backbone, tmp_path / "st")
    state = load_file(dense / "model.safetensors")
    save_file({**state, "activation_function.weight": torch.ones(1)}, dense / "model.safetensors")
    with pytest.raises(hfbert.CheckpointError, match="activation_function.weight"):
        Embedder(tmp_path / "st")


@pytest.mark.parametrize(
    "name", ["torch.utils.model_dump.__main__.Tanh", "torch.nn.modules.activation.Threshold", "torch.os.system"]
)
def test_a_dense_activation_is_looked_up_in_a_fixed_table_never_imported(sentence_backbone, tmp_path, name):
    import sys

    from hfbert.tools.embedding import Embedder

    dense = dense_checkpoint(sentence_backbone, tmp_path / "st")
    config = json.loads((dense / "config.json").read_text())
    (dense / "config.json").write_text(json.dumps({**config, "activation_function": name}))
    imported = set(sys.modules)
    with pytest.raises(ValueError, match="activation_function"):
        Embedder(tmp_path / "st")
    assert not {module for module in set(sys.modules) - imported if module.startswith("torch.utils.model_dump")}


# -- pipeline files that cannot be read -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "relative",
    ["sentence_bert_config.json", "modules.json", "POOLING/config.json", "config_sentence_transformers.json"],
)
def test_deeply_nested_pipeline_json_names_the_file(sentence_backbone, tmp_path, capsys, relative):
    directory = save_sentence_transformer(sentence_backbone, tmp_path / "st")
    if relative.startswith("POOLING"):
        relative = relative.replace("POOLING", next(path.name for path in directory.glob("*_Pooling")))
    (directory / relative).write_text(DEEP_JSON)
    capsys.readouterr()  # what building the checkpoint printed
    code, stderr = run(capsys, "embed", directory, "a text")
    assert_one_line(code, stderr, str(directory / relative), "nested too deeply")
    assert "unexpected" not in stderr


def test_a_pooling_module_without_its_config_is_refused_not_mean(tmp_path, capsys):
    """sentence-transformers cannot build a Pooling module whose config.json is missing (TypeError: no
    embedding_dimension); hfbert pooled by the mean instead, silently (the checkpoint may say CLS)."""
    directory = tmp_path / "minilm"
    shutil.copytree(minilm_directory(), directory)
    (directory / "1_Pooling" / "config.json").unlink()
    code, stderr = run(capsys, "embed", directory, "hello")
    assert_one_line(code, stderr, "1_Pooling/config.json", "Pooling")


# -- prompts in config_sentence_transformers.json -------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompts, arguments, field",
    [
        ({"default_prompt_name": "query", "prompts": ["query"]}, [], "prompts is ['query']"),
        ({"prompts": "query"}, ["--prompt-name", "query"], "prompts is 'query'"),
        ({"default_prompt_name": "query", "prompts": {"query": 5}}, [], "prompt 'query' is 5"),
        ({"prompts": {"query": ["x"]}}, ["--prompt-name", "query"], "prompt 'query' is ['x']"),
        ({"default_prompt_name": ["query"], "prompts": {"query": "q: "}}, [], "default_prompt_name is ['query']"),
    ],
)
def test_prompts_of_the_wrong_type_name_the_file_and_field(tmp_path, capsys, prompts, arguments, field):
    directory = tmp_path / "minilm"
    shutil.copytree(minilm_directory(), directory)
    (directory / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    code, stderr = run(capsys, "embed", directory, "hello", *arguments)
    assert_one_line(code, stderr, "config_sentence_transformers.json", field)


def test_a_prompt_name_whose_prompt_is_null_means_no_prompt_as_in_sentence_transformers(tmp_path):
    """sentence-transformers 6 (`_resolve_prompt`): prompt_name picks `prompts[name]`, null included, so a null
    prompt is no prompt, not the default one."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    from hfbert.tools.embedding import Embedder

    directory = tmp_path / "minilm"
    shutil.copytree(minilm_directory(), directory)
    prompts = {"prompts": {"query": "query: ", "plain": None}, "default_prompt_name": "query"}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    texts = ["A first sentence.", "Another one, about something else."]
    expected = SentenceTransformer(str(directory), device="cpu").encode(texts, prompt_name="plain")
    got = Embedder(directory, prompt_name="plain").embed(texts).numpy()
    assert np.abs(got - expected).max() < 1e-5
    with_default = SentenceTransformer(str(directory), device="cpu").encode(texts)
    assert np.abs(got - with_default).max() > 1e-3  # the case tells a prompt from none
