"""`hfbert embed` (and `Embedder`) computes what `SentenceTransformer(MODEL).encode(texts)` computes, element for
element: the checkpoint's own sentence-transformers pipeline, not mean pooling whatever the checkpoint says.

The reference is sentence-transformers itself, loading the same directory; every comparison is the max absolute
difference over all elements (a cosine would hide a missing Normalize or a wrong scale). Checkpoints:

- the real all-MiniLM-L6-v2 (the format most Hub checkpoints carry: Transformer -> Pooling(mean) -> Normalize,
  max_seq_length 256 in sentence_bert_config.json), with no flag at all;
- small random BERTs (MiniLM's tokenizer, max_seq_length 24 so that truncation runs) written by
  sentence-transformers 6.x itself, in each pooling mode, with and without Normalize, with Dense (Tanh; Identity
  with a residual), with several modes concatenated, with a default prompt that pooling leaves out;
- the same, rewritten into the older on-disk format (`sentence_transformers.models.*` types, pooling booleans,
  `max_seq_length` in sentence_bert_config.json while tokenizer_config.json says 512, Dense weights in
  pytorch_model.bin, no Normalize folder); sentence-transformers loads those too, and the test checks that it
  builds the modules it should.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hfbert.cli import main
from hfbert.tools.embedding import Embedder, embed_file
from hfbert.tools.parity import default_texts

from support.helpers import minilm_directory

sentence_transformers = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.modules import Dense, Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402

SentenceTransformer = sentence_transformers.SentenceTransformer
MAX_SEQ_LENGTH = 24
# fp32 rounding: hfbert's packed kernels sum in another order than transformers' (measured up to ~1e-6 here).
MAX_ABS = 1e-5
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def texts() -> list[str]:
    sentences = default_texts()
    return ["", "Yes.", *sentences[:20], " ".join(sentences[:6]), " ".join(sentences[6:9]), sentences[0]]


def max_abs(ours: np.ndarray, reference: np.ndarray) -> float:
    assert ours.shape == reference.shape and ours.dtype == np.float32
    return float(np.abs(ours - reference).max())


def reference_embeddings(directory: Path, inputs: list[str]) -> tuple[np.ndarray, list[str]]:
    model = SentenceTransformer(str(directory), device="cpu")
    return model.encode(inputs, convert_to_numpy=True, batch_size=8), [type(module).__name__ for module in model]


def build(backbone: Path, directory: Path, modes, *, normalize: bool, dense: str | None = None, prompt=None):
    """Save a SentenceTransformer (6.x format) of `backbone` with this pipeline into `directory`."""
    transformer = Transformer(str(backbone))
    modules = [transformer, Pooling(32, pooling_mode=modes, include_prompt=prompt is None)]
    dimension = 32 * (1 if isinstance(modes, str) else len(modes))
    torch.manual_seed(1)
    if dense == "tanh":
        modules.append(Dense(dimension, 16, activation_function=torch.nn.Tanh()))
    elif dense == "identity-residual":
        modules.append(Dense(dimension, 16, activation_function=torch.nn.Identity(), use_residual=True))
    if normalize:
        modules.append(Normalize())
    prompts = {"query": prompt} if prompt else None
    model = SentenceTransformer(
        modules=modules, device="cpu", prompts=prompts, default_prompt_name="query" if prompt else None
    )
    model.max_seq_length = MAX_SEQ_LENGTH
    model.save(str(directory))
    return directory


def to_legacy_format(directory: Path) -> Path:
    """Rewrite a 6.x save into the format most Hub checkpoints carry (see the module docstring)."""
    legacy_types = {"Transformer", "Pooling", "Dense", "Normalize"}
    modules = json.loads((directory / "modules.json").read_text())
    for module in modules:
        name = module["type"].rsplit(".", 1)[1]
        assert name in legacy_types
        module["type"] = f"sentence_transformers.models.{name}"
        folder = directory / module["path"]
        if name == "Pooling":
            config = json.loads((folder / "config.json").read_text())
            modes = config["pooling_mode"]
            modes = [modes] if isinstance(modes, str) else modes
            keys = {
                "cls": "pooling_mode_cls_token",
                "max": "pooling_mode_max_tokens",
                "mean": "pooling_mode_mean_tokens",
                "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                "weightedmean": "pooling_mode_weightedmean_tokens",
                "lasttoken": "pooling_mode_lasttoken",
            }
            legacy = {"word_embedding_dimension": config["embedding_dimension"]}
            legacy.update({key: mode in modes for mode, key in keys.items()})
            (folder / "config.json").write_text(json.dumps(legacy, indent=2))
        elif name == "Dense":
            config = json.loads((folder / "config.json").read_text())
            names = ("module_input_name", "module_output_name")  # the 6.x additions; use_residual stays
            (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in names}))
            from safetensors.torch import load_file

            torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
            (folder / "model.safetensors").unlink()
        elif name == "Normalize":
            shutil.rmtree(folder)
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False})
    )
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = 512  # as in all-MiniLM-L6-v2: the sentence-transformers value wins
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (directory / "config_sentence_transformers.json").write_text(
        json.dumps({"__version__": {"sentence_transformers": "2.0.0", "transformers": "4.6.1", "pytorch": "1.8.1"}})
    )
    return directory


def expected_modules(modes, normalize: bool, dense: str | None) -> list[str]:
    return ["Transformer", "Pooling"] + (["Dense"] if dense else []) + (["Normalize"] if normalize else [])


CASES = [(mode, normalize, None) for mode in MODES for normalize in (True, False)]
CASES += [("mean", True, "tanh"), ("max", False, "identity-residual"), (("cls", "mean"), False, None)]


@pytest.mark.parametrize("layout", ["sentence-transformers 6.x", "legacy"])
@pytest.mark.parametrize(("modes", "normalize", "dense"), CASES, ids=lambda value: str(value))
def test_each_pipeline_equals_sentence_transformers(sentence_backbone, tmp_path, layout, modes, normalize, dense):
    directory = build(sentence_backbone, tmp_path / "model", modes, normalize=normalize, dense=dense)
    if layout == "legacy":
        to_legacy_format(directory)
    inputs = texts()
    reference, modules = reference_embeddings(directory, inputs)
    assert modules == expected_modules(modes, normalize, dense)  # the reference read the format as meant
    embedder = Embedder(directory, batch_size=8)
    difference = max_abs(embedder.embed(inputs).numpy(), reference)
    print(f"{layout}, pooling {modes}, normalize {normalize}, dense {dense}: max abs {difference:.2e}")
    assert difference <= MAX_ABS
    assert embedder.max_length == MAX_SEQ_LENGTH
    if normalize:
        assert np.allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-6)


def test_a_default_prompt_left_out_of_pooling(sentence_backbone, tmp_path):
    """config_sentence_transformers.json's default prompt is prepended; include_prompt=False pools without it."""
    directory = build(sentence_backbone, tmp_path / "model", "mean", normalize=True, prompt="query: ")
    inputs = texts()
    reference, _ = reference_embeddings(directory, inputs)
    embedder = Embedder(directory, batch_size=8)
    assert embedder.prompt_length > 0 and "prompt 'query: '" in embedder.pipeline.describe()
    assert max_abs(embedder.embed(inputs).numpy(), reference) <= MAX_ABS


def test_real_minilm_with_no_flags_equals_encode(tmp_path, capsys):
    """The README's checkpoint: unit vectors from its Normalize module, truncation at its 256 tokens."""
    inputs = texts() + [" ".join(default_texts()) * 2]  # over 256 tokens
    reference, modules = reference_embeddings(minilm_directory(), inputs)
    assert modules == ["Transformer", "Pooling", "Normalize"]
    source = tmp_path / "texts.txt"
    source.write_text("".join(text + "\n" for text in inputs), encoding="utf-8")
    out = tmp_path / "embeddings.npy"
    assert main(["embed", str(minilm_directory()), "--file", str(source), "--out", str(out)]) == 0
    difference = max_abs(np.load(out), reference)
    print(f"all-MiniLM-L6-v2, no flags: max abs {difference:.2e}")
    assert difference <= 1e-6
    stderr = capsys.readouterr().err
    assert (
        "pipeline  sentence-transformers (modules.json): Transformer(max_seq_length=256) -> Pooling(mean) -> Normalize"
        in stderr
    )
    assert f"wrote {len(inputs)} embeddings of size 384 to {out}" in stderr


def test_flags_override_the_checkpoint(tmp_path, capsys):
    """--pooling cls --no-normalize --max-length 128 on MiniLM equals sentence-transformers told the same."""
    inputs = texts()
    model = SentenceTransformer(str(minilm_directory()), device="cpu")
    model.max_seq_length = 128
    cls = SentenceTransformer(modules=[model[0], Pooling(384, pooling_mode="cls")], device="cpu")
    reference = cls.encode(inputs, convert_to_numpy=True)
    out = tmp_path / "cls.jsonl"
    arguments = ["--pooling", "cls", "--no-normalize", "--max-length", "128", "--out", str(out)]
    assert main(["embed", str(minilm_directory()), *inputs, *arguments]) == 0
    ours = np.array([record["embedding"] for record in map(json.loads, out.read_text().splitlines())], np.float32)
    assert max_abs(ours, reference) <= 1e-5
    assert "(overridden: pooling cls, no Normalize, max_length 128)" in capsys.readouterr().err


def test_a_plain_checkpoint_gets_what_sentence_transformers_builds_for_it(sentence_backbone):
    """No modules.json: SentenceTransformer adds mean pooling and nothing else; so does hfbert."""
    inputs = texts()
    reference, modules = reference_embeddings(sentence_backbone, inputs)
    assert modules == ["Transformer", "Pooling"]
    embedder = Embedder(sentence_backbone, batch_size=8)
    assert embedder.pipeline.pooling == ("mean",) and not embedder.pipeline.normalize
    assert max_abs(embedder.embed(inputs).numpy(), reference) <= MAX_ABS


def test_unsupported_modules_are_refused_by_name(sentence_backbone, tmp_path, capsys):
    directory = build(sentence_backbone, tmp_path / "model", "mean", normalize=True)
    modules = json.loads((directory / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})
    (directory / "modules.json").write_text(json.dumps(modules))
    from support.robust import assert_one_line, run

    capsys.readouterr()  # what building the checkpoint printed
    assert_one_line(*run(capsys, "embed", directory, "x"), "'sentence_transformers.models.LayerNorm' is not one")


def test_one_text_gives_one_vector_as_sentence_transformers(sentence_backbone, tmp_path):
    """A str is one text, as in sentence-transformers' `encode`: one (dimension,) vector, not one per character; a
    list of that one text gives a (1, dimension) array. `embed_file` refuses a str, naming `texts`."""
    directory = build(sentence_backbone, tmp_path / "model", "mean", normalize=True)
    model, embedder = SentenceTransformer(str(directory), device="cpu"), Embedder(directory)
    text = "A single text, not one per character."
    for inputs in (text, [text]):
        expected = model.encode(inputs, convert_to_numpy=True)
        assert max_abs(embedder.embed(inputs).numpy(), expected) <= MAX_ABS  # shapes (32,), then (1, 32)
    with pytest.raises(TypeError, match=r"texts is a str: give a list of texts \(\[text\] for one\)"):
        embed_file(embedder, text, tmp_path / "out.npy", progress=False)
    assert not (tmp_path / "out.npy").exists()
