"""The ahead-of-time path, `optimize_for_inference(model, compile="aot")` (`inference/aot.py`): the forward exported
with dynamic shapes and compiled by AOTInductor into a package on disk.

Held to each precision's contract against transformers in float64 (fp32: RMS error at most 1.5x or 3x transformers
fp32's own; bf16: at most OpenVINO bf16's on the same batch), pad positions zero as in the eager padding-free path;
a second model with the same weights loads the package instead of compiling; a weight change after building builds
the package of the new weights (never runs the old one); a hook runs the eager mode. Compiling takes tens of seconds
per package: those tests are `slow`, on a small config.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_compiled import compiler, right_padded
from test_compiled_fp32 import CONFIG, pair, rms_error

import hfbert
from hfbert.inference import aot, inference_mode_of, packed_layers
from hfbert.inference.aot import aot_report
from hfbert.inference.bf16 import bf16_available
from hfbert.inference.compiled import compile_report, is_compiled
from hfbert.inference.optimize import ACCURACY_BOUNDS
from hfbert.inference.packed import packing_supported

from support.helpers import minilm_directory, parity_texts

packing = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN fp32 packing")


@pytest.fixture(autouse=True)
def package_folder(tmp_path, monkeypatch):
    """Each test's packages (and kernel choices) in a folder of its own."""
    monkeypatch.setenv("HFBERT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "aot"


def test_a_bad_compile_value_is_one_error_naming_the_values_and_changes_nothing():
    model = hfbert.BertModel(hfbert.BertConfig(**CONFIG))
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"compile must be True, False or 'aot', not 'aotx'"):
        hfbert.optimize_for_inference(model, compile="aotx")
    assert not is_compiled(model) and not packed_layers(model) and inference_mode_of(model) is None
    assert all(torch.equal(tensor, state[name]) for name, tensor in model.state_dict().items())


def test_a_model_the_aot_path_cannot_run_is_refused_before_anything_changes():
    with pytest.raises(TypeError, match="compile='aot' runs hfbert's encoders"):
        hfbert.optimize_for_inference(torch.nn.Sequential(torch.nn.Linear(512, 512)), compile="aot")


@packing
@compiler
def test_int8_has_no_aot_route_and_runs_the_compiled_path():
    model = hfbert.BertModel(hfbert.BertConfig(**CONFIG))
    hfbert.optimize_for_inference(model, quantize="int8", compile="aot")
    assert inference_mode_of(model).mode == "int8 compiled" and is_compiled(model)


@packing
@compiler
def test_a_hook_runs_the_eager_mode_and_compiles_nothing():
    model, reference, _ = pair()
    hfbert.optimize_for_inference(model, precision="high", kernels="always", compile="aot")  # nothing measured
    seen = []
    model.encoder.layer[0].register_forward_hook(lambda module, args, output: seen.append(output[0].shape))
    inputs = right_padded(2, 14, [14, 14])
    with torch.no_grad():
        output = model(**inputs).last_hidden_state
        expected = reference(**inputs).last_hidden_state
    assert seen and aot_report(model) == {} and compile_report(model) == {}
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # two AOTInductor compilations per precision
@packing
@compiler
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_aot_fp32_holds_the_precisions_contract_against_float64(precision):
    """Token ids alone, and a right-padded batch with its mask: every real position and the pooler within the
    precision's contract, pad positions exactly zero; both from packages compiled here."""
    model, reference, exact = pair()
    hfbert.optimize_for_inference(model, precision=precision, compile="aot")
    assert inference_mode_of(model).mode == ("fp32 aot" if precision == "highest" else "fp32 high aot")
    bound = ACCURACY_BOUNDS[precision]
    for inputs in (right_padded(3, 14, [14, 14, 14]), right_padded(3, 14, [14, 11, 13])):
        real = inputs["attention_mask"].bool()
        with torch.no_grad():
            output, expected, wanted = model(**inputs), reference(**inputs), exact(**inputs)
        for ours, theirs, truth in (
            (output.last_hidden_state[real], expected.last_hidden_state[real], wanted.last_hidden_state[real]),
            (output.pooler_output, expected.pooler_output, wanted.pooler_output),
        ):
            assert 0 < rms_error(ours, truth) <= bound * rms_error(theirs, truth), precision
        assert torch.equal(output.last_hidden_state[~real], torch.zeros(int((~real).sum()), 512))
    built = aot_report(model)
    assert [variant for variant, _ in built] == [("input_ids",), ("input_ids", "attention_mask")]
    assert not any(entry.loaded for entry in built.values())


@pytest.mark.slow  # one AOTInductor compilation, then loads
@packing
@compiler
def test_a_second_model_loads_the_package_and_a_weight_change_never_runs_the_old_one(package_folder, monkeypatch):
    """The second model (same weights, a fresh process's view) loads from disk, compiling nothing; then its weights
    change (an in-place write, a `.data` write, `load_state_dict`): each next call matches transformers on the new
    weights."""
    model, reference, _ = pair()
    twin = copy.deepcopy(model)
    inputs = dict(input_ids=torch.randint(1000, 20000, (2, 9)))
    hfbert.optimize_for_inference(model, precision="high", compile="aot")
    with torch.no_grad():
        model(**inputs)
    assert len(list(package_folder.glob("*.pt2"))) == 1

    def refused(*args, **kwargs):
        raise AssertionError("compiled instead of loading")

    monkeypatch.setattr(aot, "compile_package", refused)
    hfbert.optimize_for_inference(twin, precision="high", compile="aot")
    with torch.no_grad():
        output = twin(**inputs).last_hidden_state
        torch.testing.assert_close(output, reference(**inputs).last_hidden_state, rtol=1e-4, atol=1e-4)
    assert [entry.loaded for entry in aot_report(twin).values()] == [True]
    monkeypatch.undo()

    def changed(change) -> None:
        with torch.no_grad():
            change()
            torch.testing.assert_close(
                twin(**inputs).last_hidden_state, reference(**inputs).last_hidden_state, rtol=1e-4, atol=1e-4
            )

    layer_norm = twin.encoder.layer[0].output.LayerNorm.weight
    changed(lambda: (layer_norm.mul_(1.5), reference.encoder.layer[0].output.LayerNorm.weight.mul_(1.5)))
    words = twin.embeddings.word_embeddings.weight
    changed(lambda: (words.data.mul_(0.5), reference.embeddings.word_embeddings.weight.data.mul_(0.5)))
    torch.manual_seed(1)
    state = {name: torch.randn_like(tensor) * 0.05 for name, tensor in reference.state_dict().items()}
    changed(lambda: (twin.load_state_dict(state), reference.load_state_dict(state)))
    assert sorted(generation for _, generation in aot_report(twin)) == [0, 1, 2, 3]


ORDER_PROBE = """
import sys, zipfile, torch, hfbert
from hfbert.inference.aot import aot_report
# compile=True's inductor options first (freezing, no weight packing): a process's first freezing compile, after
# which inductor would register its packing patterns for no later compile.
with torch._inductor.config.patch({"freezing": True, "cpp.weight_prepack": False}), torch.no_grad():
    torch.compile(torch.nn.Linear(8, 8).eval())(torch.randn(2, 8))
config = hfbert.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128)
for precision in ("high", "highest"):  # the unpacked route after a packed one too
    model = hfbert.optimize_for_inference(hfbert.BertModel(config).eval(), precision=precision, compile="aot")
    with torch.no_grad():
        model(input_ids=torch.randint(5, 100, (2, 6)))
    (built,) = aot_report(model).values()
    with zipfile.ZipFile(built.path) as package:
        wrapper = [name for name in package.namelist() if name.endswith(".wrapper.cpp")]
        print(precision, package.read(wrapper[0]).decode().count("_linear_pointwise"))
"""


@pytest.mark.slow  # two AOTInductor compilations and a torch.compile, in a fresh process
@packing
@compiler
def test_each_route_packs_its_products_or_not_whatever_compiled_before_in_the_process(package_folder):
    """Inductor registers its oneDNN packing patterns once per process, at the first freezing compile with
    `cpp.weight_prepack` on, and then packs in every freezing compile: each package is compiled in a process of its
    own, so the `high` package after a compile without packing still holds oneDNN's products (`_linear_pointwise`),
    and the `highest` package after it holds none (its contract is ATen's products)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", ORDER_PROBE], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = dict(line.split() for line in done.stdout.splitlines() if line.startswith("high"))
    assert int(counts["high"]) > 0 and int(counts["highest"]) == 0, counts


@pytest.mark.slow  # one AOTInductor compilation of a tiny ModernBERT
@packing
@compiler
def test_modernbert_runs_its_package_within_the_fp32_contract(tmp_path):
    """ModernBERT's tiny config (a local layer of a 2-column window each side): its package against transformers'
    ModernBertModel in float64, within 1.5x transformers fp32's error."""
    from support.members import reference_checkpoint

    directory = reference_checkpoint(tmp_path / "modernbert", "modernbert", max_position_embeddings=64)
    import transformers

    reference = transformers.ModernBertModel.from_pretrained(directory).eval()
    exact = copy.deepcopy(reference).double()
    model = hfbert.optimize_for_inference(hfbert.ModernBertModel.from_pretrained(directory), compile="aot")
    ids = torch.randint(3, 99, (2, 24))
    with torch.no_grad():
        ours, theirs, truth = model(input_ids=ids)[0], reference(input_ids=ids)[0], exact(input_ids=ids)[0]
    assert len(aot_report(model)) == 1
    assert rms_error(ours, truth) <= 1.5 * rms_error(theirs, truth) + 1e-7


@pytest.mark.slow  # an AOTInductor compilation of all-MiniLM-L6-v2, and OpenVINO
@pytest.mark.skipif(not bf16_available(), reason="this CPU does not compute bf16 natively: no bf16 mode")
@compiler
def test_aot_bf16_keeps_the_bf16_contract_on_real_minilm(tmp_path):
    """The bf16 mode's contract on all-MiniLM-L6-v2 (`test_bf16.py`'s batch of 8 texts cut to 32 tokens, no
    padding): cosine to transformers fp32 at every token, RMS error against float64 at most OpenVINO bf16's."""
    import transformers
    from test_bf16 import MIN_COSINE, real_token_errors

    directory = minilm_directory()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    reference = transformers.BertModel.from_pretrained(directory).eval()
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(directory), precision="bf16", compile="aot")
    assert inference_mode_of(model).mode == "bf16 aot"
    sentences = parity_texts(32)
    texts = [" ".join(sentences[start : start + 4]) for start in range(0, 32, 4)]
    batch = dict(tokenizer(texts, truncation=True, max_length=32, return_tensors="pt"))
    cosines, ours, openvino = real_token_errors(model, reference, batch, directory, tmp_path)
    assert len(aot_report(model)) == 1
    assert cosines.min() >= MIN_COSINE, float(cosines.min())
    assert 1e-4 < ours <= openvino, (ours, openvino)


@pytest.mark.slow  # an AOTInductor compilation of all-MiniLM-L6-v2
@packing
@compiler
def test_embed_with_compile_aot_equals_sentence_transformers(capsys, package_folder):
    """One text (a batch without pads, so the package runs it): sentence-transformers' embedding within
    test_embed_cli.py's bound, and the package kept on disk."""
    import json

    sentence_transformers = pytest.importorskip("sentence_transformers")
    from test_embed_cli import assert_matches, embed

    text = "The quick brown fox jumps over the lazy dog near the river bank."
    assert embed(text, "--compile", "aot") == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = sentence_transformers.SentenceTransformer(str(minilm_directory()), device="cpu").encode(
        [text], normalize_embeddings=True, convert_to_numpy=True
    )
    assert_matches(np.array([records[0]["embedding"]], dtype=np.float32), expected)
    assert list(package_folder.glob("*.pt2"))
