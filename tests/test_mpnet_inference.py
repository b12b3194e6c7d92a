"""`hfbert.optimize_for_inference` on MPNet (issue #42): every mode swaps MPNet's layers as it swaps BERT's, and
holds BERT's contracts, element-wise against transformers' MPNet models given the same weights.

- what is swapped: every large linear layer (packed or int8); attention's q, k and v as one fused product
  (`FusedMPNetSelfAttention`, the fast fp32 mode and int8), its `o` packed or int8 as any other layer;
- the contracts: the fp32 modes' RMS error against float64 at most 1.5x (`precision="high"`: 3x) transformers' own;
  int8 within int8's error of transformers fp32 (a relative RMS error of about 0.01 here); on padding-free and padded
  batches (the position bias is cut per bucket in one, added whole in the other), for the model and every head;
- the fused block follows its weights as BERT's does (test_optimized_follows_weights.py): changed weights,
  `load_state_dict`, moves, hooks on its projections and on `o`, PEFT's LoRA, copies;
- every test of a mode at two widths: 64 in the default run (the size thresholds lowered so that the same layers
  are swapped), bert-base's in the slow one;
- slow: the real all-mpnet-base-v2 on real texts, and the compiled int8 path (the bias computed inside the graph).

The weights are random and far from transformers' init, and the position bias is drawn large (std 1, as large as
the scores), so that a path that dropped or misplaced it would fail every bound here.
"""

from __future__ import annotations

import copy
import functools
import pickle
import sys

import pytest
import torch
import torch.nn.functional as F
from test_compiled import compiler, relative_rms
from test_optimized_follows_weights import CHANGES

import hfbert
from hfbert.inference import packed_layers
from hfbert.inference.int8 import int8_available
from hfbert.inference.packed import packing_supported

from support.helpers import Accuracy, randomize_weights, swap_as_at_bert_base
from support.members import tiny_config

int8 = pytest.mark.skipif(not int8_available(), reason="this torch build or CPU has no oneDNN int8 inner product")
packs = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN to pack for")
# The family's tiny MPNet (support.members) with a small vocabulary, at two widths: 64 in the default run, where the
# size thresholds (MIN_PACKED_WEIGHTS 2**19, MIN_INT8_WEIGHTS 2**16) are lowered to a 64 x 64 layer's so that every
# mode swaps what it swaps at bert-base's width; and bert-base's width itself (the thresholds as they are) in the slow
# run.
# Every test of a mode runs at both (`modes`); the others at bert-base's width.
BASE_SHAPE = tiny_config("mpnet", vocab_size=1000, max_position_embeddings=514)
SHAPES = {
    "tiny": {**BASE_SHAPE, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128},
    "bert-base width": {**BASE_SHAPE, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
}
# randomize_weights draws std 0.1, which at bert-base's width makes each query's scores peak on one key (any rounding
# then flips the softmax); linear weights at a trained model's scale (std 0.02) keep the scores within a few units.
# At width 64 std 0.1 keeps them so.
LINEAR_SCALES = {"tiny": 1.0, "bert-base width": 0.2}
SHAPE = SHAPES["bert-base width"]
# mode -> its options, and its contract: the ratio to transformers' RMS error against float64 (None: int8, lossy).
MODES = {
    "highest": (dict(kernels="always"), 1.5),
    "high": (dict(precision="high", kernels="always"), 3.0),
    "int8": (dict(quantize="int8"), None),
}
INT8_ERROR = 0.05  # relative RMS error against transformers fp32 allowed to int8 (about 0.01 here)
FP32_ERROR = 1e-5  # the same for the fp32 modes, where a change must be followed (about 1e-7 here)
# int8 after a change: weights x3 in every layer sharpen the attention, and int8's error grows with it (0.074 on
# AVX2 without VNNI, whose weights use 63 levels); a model that kept its old weights is off by 0.5-1.3.
INT8_FOLLOW_ERROR = 0.15
# What each mode runs in every layer (names under `encoder.layer.N.`), and on the pooler.
SWAPPED = {
    "highest": {
        "attention.attn.q": "packed",
        "attention.attn.k": "packed",
        "attention.attn.v": "packed",
        "attention.attn.o": "packed",
        "intermediate.dense": "packed",
        "output.dense": "packed",
    },
    "high": {"attention.attn": "fused", "attention.attn.o": "packed", "intermediate": "fused", "output": "fused"},
    "int8": {
        "attention.attn": "int8",
        "attention.attn.o": "int8",
        "intermediate.dense": "int8",
        "output.dense": "int8",
    },
}
TASKS = ["ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]


def modes(*names: str):
    """The test for each mode in `names`, at each width: tiny in the default run, bert-base's in the slow one."""
    marks = {"int8": int8, "high": packs, "highest": packs}
    by_mode = pytest.mark.parametrize("mode", [pytest.param(name, marks=marks[name]) for name in names])
    widths = ["tiny", pytest.param("bert-base width", marks=pytest.mark.slow)]
    by_width = pytest.mark.parametrize("width", widths, indirect=True)
    return lambda test: by_width(by_mode(test))


@pytest.fixture(autouse=True)
def width(request, monkeypatch) -> str:
    """The width the test's models are built at (`SHAPE`): its parameter, bert-base's by default. At the tiny width
    the thresholds are a hidden x hidden layer's, as they sit at bert-base's width."""
    name = getattr(request, "param", "bert-base width")
    monkeypatch.setattr(sys.modules[__name__], "SHAPE", SHAPES[name])
    if name == "tiny":
        swap_as_at_bert_base(monkeypatch, SHAPES[name]["hidden_size"])
    return name


def mpnet_pair(task: str = "Model", seed: int = 0, **fields):
    """transformers' `MPNet<task>` with random weights and a large position bias, and hfbert's with the same
    weights, both in eval mode (copies: each test changes its own)."""
    return copy.deepcopy(_drawn_pair(task, seed, tuple(sorted({**SHAPE, **fields}.items()))))


@functools.cache
def _drawn_pair(task: str, seed: int, fields: tuple):
    import transformers

    config = dict(fields)
    torch.manual_seed(seed)
    reference = getattr(transformers, f"MPNet{task}")(transformers.MPNetConfig(**config))
    randomize_weights(reference).eval()
    with torch.no_grad():
        for layer in reference.modules():
            if isinstance(layer, torch.nn.Linear):
                layer.weight.mul_(LINEAR_SCALES[width_of(config)])
        reference.base_model.encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
    model = getattr(hfbert, f"MPNet{task}")(hfbert.MPNetConfig(**config)).eval()
    model.load_state_dict(reference.state_dict())
    return model, reference


def width_of(config: dict) -> str:
    return next(name for name, shape in SHAPES.items() if shape["hidden_size"] == config["hidden_size"])


def optimized_pair(mode: str, task: str = "Model", seed: int = 0, **fields):
    model, reference = mpnet_pair(task, seed, **fields)
    hfbert.optimize_for_inference(model, **MODES[mode][0])
    return model, reference


def expected_swaps(mode: str, layers: int = SHAPE["num_hidden_layers"], prefix: str = "") -> dict[str, str]:
    """What `mode` swaps in an MPNet encoder (`prefix`: the task models' "mpnet."), and in its pooler."""
    swaps = {
        f"{prefix}encoder.layer.{index}.{name}": kernel
        for index in range(layers)
        for name, kernel in SWAPPED[mode].items()
    }
    return swaps | {f"{prefix}pooler.dense": "int8" if mode == "int8" else "packed"}


def encoder_swaps(mode: str) -> set[tuple[str, str]]:
    """What `mode` swaps in a task model's encoder (MPNet's task models have no pooler, but multiple choice)."""
    return {(name, kernel) for name, kernel in expected_swaps(mode, prefix="mpnet.").items() if "pooler" not in name}


def right_padded(lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Ids of MPNet's vocabulary (its pad id is 1) padded on the right to the longest of `lengths`."""
    longest = max(lengths)
    ids = torch.randint(5, SHAPE["vocab_size"], (len(lengths), longest), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).long()
    return dict(input_ids=torch.where(mask.bool(), ids, 1), attention_mask=mask)


# Long enough for the logarithmic buckets of the bias; 33 and 40 share a padding-free bucket, 9 has its own.
LENGTHS = [40, 33, 9]
# The heads' outputs are few numbers a row: enough rows that their RMS errors measure the kernels, not chance.
HEAD_LENGTHS = [40, 33, 9, 25, 17, 38, 12, 30] * 2


def outputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The last hidden states at real positions and the pooled output, flat."""
    inputs = right_padded(LENGTHS) if inputs is None else inputs
    with torch.no_grad():
        output = model(**inputs)
    real = inputs["attention_mask"].bool()
    return torch.cat([output.last_hidden_state[real].flatten(), output.pooler_output.flatten()])


def check_contract(mode: str, ours: torch.Tensor, theirs: torch.Tensor, exact: torch.Tensor) -> None:
    ratio = MODES[mode][1]
    if ratio is None:
        assert 0 < relative_rms(ours, theirs) < INT8_ERROR, relative_rms(ours, theirs)
        return
    record = Accuracy().add(ours, theirs, exact)
    assert record.theirs > 0 and record.passed(ratio=ratio), (record.ours, record.theirs, ratio)
    assert (ours - theirs).abs().max() <= 1e-4 * exact.abs().max()


# -- what is swapped ------------------------------------------------------------------------------------------------
@modes("highest", "high", "int8")
def test_each_mode_swaps_mpnets_layers_and_keeps_its_parameters(mode):
    """The fast fp32 mode and int8 fuse attention's q, k and v (`attention.attn`) and swap its `o` as any other layer;
    the parameters, the state dict and, after `restore_weights`, the module classes are the model's own."""
    model, _ = mpnet_pair()
    plain = copy.deepcopy(model)
    parameters = dict(model.named_parameters())
    hfbert.optimize_for_inference(model, **MODES[mode][0])
    assert packed_layers(model) == expected_swaps(mode)
    if mode != "highest":
        assert type(model.encoder.layer[0].attention.attn).__name__ == "FusedMPNetSelfAttention"
    assert {name: id(p) for name, p in model.named_parameters()} == {name: id(p) for name, p in parameters.items()}
    state, expected = model.state_dict(), plain.state_dict()
    assert list(state) == list(expected) and all(torch.equal(state[key], expected[key]) for key in expected)
    assert hfbert.inference.inference_mode_of(model).swapped == len(expected_swaps(mode))
    hfbert.restore_weights(model)
    assert [type(module) for module in model.modules()] == [type(module) for module in plain.modules()]


# -- the contracts --------------------------------------------------------------------------------------------------
@modes("highest", "high", "int8")
@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
def test_each_mode_holds_its_contract_against_transformers(mode, padding_free):
    """Real positions and the pooler against transformers' MPNetModel fp32 and float64 (eager, its only attention);
    pad positions zero where the batch ran padding-free, as in the plain model."""
    model, reference = optimized_pair(mode)
    assert packed_layers(model) == expected_swaps(mode)
    model.padding_free = padding_free
    inputs = right_padded(LENGTHS)
    ours, theirs = outputs(model, inputs), outputs(reference, inputs)
    check_contract(mode, ours, theirs, outputs(copy.deepcopy(reference).double(), inputs))
    with torch.no_grad():
        pads = model(**inputs).last_hidden_state[inputs["attention_mask"] == 0]
    assert bool((pads == 0).all()) == padding_free


@modes("highest", "high", "int8")
@pytest.mark.parametrize("task", TASKS)
def test_each_mode_holds_its_contract_on_the_task_heads(mode, task):
    model, reference = optimized_pair(mode, task, num_labels=2 if task == "ForQuestionAnswering" else 3)
    assert encoder_swaps(mode) <= packed_layers(model).items()
    inputs = right_padded(HEAD_LENGTHS)
    exact = copy.deepcopy(reference).double()

    def logits(network) -> torch.Tensor:
        with torch.no_grad():
            output = network(**inputs)
        if task == "ForQuestionAnswering":
            return torch.cat([output.start_logits, output.end_logits])[torch.cat([inputs["attention_mask"]] * 2) == 1]
        if task == "ForSequenceClassification":
            return output.logits.flatten()
        return output.logits[inputs["attention_mask"] == 1].flatten()

    check_contract(mode, logits(model), logits(reference), logits(exact))


@modes("highest", "high", "int8")
def test_each_mode_holds_its_contract_on_multiple_choice(mode):
    """Multiple choice runs its backbone padded (heads.py): the bias added whole, not per bucket."""
    model, reference = optimized_pair(mode, "ForMultipleChoice")
    assert encoder_swaps(mode) <= packed_layers(model).items()
    inputs = {name: tensor.view(8, 2, -1) for name, tensor in right_padded(HEAD_LENGTHS).items()}
    with torch.no_grad():
        ours, theirs, exact = (
            network(**inputs).logits for network in (model, reference, copy.deepcopy(reference).double())
        )
    check_contract(mode, ours.flatten(), theirs.flatten(), exact.flatten())


# -- the fused block follows its weights ----------------------------------------------------------------------------
def mpnet_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """Every linear layer of the encoder and the pooler (the same names in hfbert and transformers)."""
    names = ("attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o")
    names += ("intermediate.dense", "output.dense")
    layers = [
        model.get_submodule(f"encoder.layer.{i}.{name}") for i in range(len(model.encoder.layer)) for name in names
    ]
    return [*layers, model.pooler.dense]


def assert_follows(mode: str, model, reference, before: torch.Tensor) -> None:
    """`model` computes what `reference` does now; what it computed `before` the change would not pass."""
    bound = INT8_FOLLOW_ERROR if mode == "int8" else FP32_ERROR
    expected = outputs(reference)
    assert relative_rms(outputs(model), expected) < bound < relative_rms(before, expected)


@modes("highest", "high", "int8")
@pytest.mark.parametrize("change", list(CHANGES))
def test_changed_weights_are_followed(mode, change):
    model, reference = optimized_pair(mode)
    before = outputs(model)
    for network in (model, reference):
        for layer in mpnet_linears(network):
            CHANGES[change](layer)
    assert_follows(mode, model, reference, before)


@modes("highest", "high", "int8")
def test_load_state_dict_is_followed(mode):
    model, reference = optimized_pair(mode)
    before = outputs(model)
    other, _ = mpnet_pair(seed=1)
    for network in (model, reference):
        network.load_state_dict(other.state_dict())
    assert_follows(mode, model, reference, before)


@modes("highest", "high", "int8")
def test_moves_copies_and_pickles_are_followed(mode):
    """A copy and a pickle run the same kernels; float64 runs the plain computation (transformers' float64 numbers),
    and back in fp32 the kernels run again."""
    model, reference = optimized_pair(mode)
    expected = outputs(model)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert packed_layers(other) == expected_swaps(mode) and torch.equal(outputs(other), expected)
    model.double()
    assert not packed_layers(model)
    assert (outputs(model) - outputs(copy.deepcopy(reference).double())).abs().max() <= 1e-10
    model.float()
    assert packed_layers(model) == expected_swaps(mode) and torch.equal(outputs(model), expected)


@modes("high", "int8")
def test_a_hook_on_q_k_or_v_runs_the_plain_block_and_one_on_o_keeps_the_fused_product(mode, monkeypatch):
    """A hook on a projection the fused product computes must see that projection's own call: the block runs its
    plain way. `o` is a layer of its own, called by the fused block too: a hook on it runs, and the product stays
    fused. Both compute what transformers does with the same hook."""
    model, reference = optimized_pair(mode)
    attention = model.encoder.layer[0].attention.attn
    products = []
    monkeypatch.setattr(
        attention, "project", lambda rows, fused=attention.project: products.append(rows) or fused(rows)
    )

    def double(module, args, output):
        return 2 * output

    for name, fused in (("o", True), ("k", False)):
        handles = [network.encoder.layer[0].attention.attn.get_submodule(name) for network in (model, reference)]
        handles = [layer.register_forward_hook(double) for layer in handles]
        products.clear()
        before = outputs(model)
        check_contract(mode, before, outputs(reference), outputs(copy.deepcopy(reference).double()))
        assert bool(products) == fused, name
        for handle in handles:
            handle.remove()
    products.clear()
    outputs(model)
    assert products


@modes("high", "int8")
@pytest.mark.parametrize("when", ["before", "after"])
def test_lora_on_q_and_v_is_computed_and_merged(mode, when):
    """PEFT's LoRA around q and v, added before or after optimizing: the adapters run (the block's plain way); merged
    by `merge_and_unload` (a `.data` write), the fused block computes the merged weights."""
    peft = pytest.importorskip("peft", reason="the LoRA tests run real PEFT")
    model, reference = mpnet_pair() if when == "before" else optimized_pair(mode)
    plain = outputs(reference)  # without the adapters
    config = peft.LoraConfig(target_modules=["q", "v"], r=8, lora_alpha=32, init_lora_weights=False)
    torch.manual_seed(1)
    model = peft.get_peft_model(model, config)
    reference = peft.get_peft_model(reference, config)
    reference.load_state_dict(model.state_dict())
    if when == "before":
        hfbert.optimize_for_inference(model, **MODES[mode][0])
    assert not any(name.endswith("attention.attn") for name in packed_layers(model))
    assert_follows(mode, model, reference, plain)
    model, reference = model.merge_and_unload(), reference.merge_and_unload()
    assert type(model) is hfbert.MPNetModel
    # Adapters added after optimizing: the fused block was in place all along (plain while they were there); added
    # before, q and v were LoRA wrappers when the model was optimized, so nothing fused them (as in BERT).
    assert (packed_layers(model) == expected_swaps(mode)) == (when == "after")
    assert_follows(mode, model, reference, plain)


# -- real weights and the compiled path (slow) ----------------------------------------------------------------------
@pytest.mark.slow  # all-mpnet-base-v2 in three modes, transformers fp32 and float64
@packs
@int8
def test_real_all_mpnet_base_v2_in_every_eager_mode(real_mpnet):
    """16 real texts, one padded batch (run padding-free): the default mode within 1.5x transformers' error against
    float64, the fast mode within 3x; int8's sentence embeddings (mean-pooled, normalized, as sentence-transformers
    gives them) at min cosine 0.99 to transformers fp32 (0.996 measured here)."""
    import transformers

    from hfbert.tools.parity import default_texts

    tokenizer = transformers.AutoTokenizer.from_pretrained(real_mpnet)
    inputs = dict(tokenizer(default_texts()[:16], padding=True, return_tensors="pt"))
    real = inputs["attention_mask"].bool()
    weights = inputs["attention_mask"].unsqueeze(-1).double()

    def run(network) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            hidden = network(**inputs).last_hidden_state
        return hidden[real], F.normalize((hidden.double() * weights).sum(1) / weights.sum(1), dim=-1)

    theirs, their_embeddings = run(transformers.MPNetModel.from_pretrained(real_mpnet).eval())
    exact, _ = run(transformers.MPNetModel.from_pretrained(real_mpnet, dtype=torch.float64).eval())
    for mode in ("highest", "high", "int8"):
        model = hfbert.optimize_for_inference(hfbert.MPNetModel.from_pretrained(real_mpnet), **MODES[mode][0])
        assert packed_layers(model) == expected_swaps(mode, 12)
        ours, embeddings = run(model)
        if mode == "int8":
            cosines = F.cosine_similarity(embeddings, their_embeddings)
            assert cosines.min() >= 0.99 and (embeddings - their_embeddings).abs().max() <= 0.03, cosines
            assert (ours - theirs).abs().max() <= 0.2
        else:
            check_contract(mode, ours, theirs, exact)


@pytest.mark.slow  # two compilations
@int8
@compiler
def test_the_compiled_int8_path_runs_mpnet_with_its_bias():
    """The bias is computed inside the compiled forward: the compiled model is as close to transformers fp32 as the
    eager int8 model (the same kernels; test_compiled.py's rule for BERT), pad positions zero; a third positional
    argument is MPNet's `position_ids` (BERT's would be token types, which MPNet refuses)."""
    model, reference = mpnet_pair(num_hidden_layers=1)
    eager = hfbert.optimize_for_inference(copy.deepcopy(model), quantize="int8")
    hfbert.optimize_for_inference(model, quantize="int8", compile=True)
    assert packed_layers(model) == expected_swaps("int8", 1)
    inputs = right_padded([16, 14])
    real = inputs["attention_mask"].bool()
    positions = torch.arange(2, 18).expand(2, 16)
    with torch.no_grad():
        compiled = model(**inputs).last_hidden_state
        by_position = model(inputs["input_ids"], inputs["attention_mask"], positions).last_hidden_state
        runs = {
            name: network(**inputs).last_hidden_state for name, network in (("eager", eager), ("theirs", reference))
        }
        runs["eager by position"] = eager(**inputs, position_ids=positions).last_hidden_state
        runs["theirs by position"] = reference(**inputs, position_ids=positions).last_hidden_state
    assert len(hfbert.inference.compiled.compile_report(model)) == 2
    assert not compiled[~real].any() and not by_position[~real].any()
    for ours, eager_run, theirs in (
        (compiled, "eager", "theirs"),
        (by_position, "eager by position", "theirs by position"),
    ):
        error = relative_rms(ours[real], runs[theirs][real])
        eager_error = relative_rms(runs[eager_run][real], runs[theirs][real])
        assert 0 < error <= 1.2 * eager_error + 1e-4 and eager_error < INT8_ERROR, (error, eager_error)


@int8
@compiler
def test_the_compiled_path_binds_a_call_by_mpnets_own_signature():
    """MPNet's forward has no `token_type_ids` and another positional order than BERT's: a third positional argument
    is `position_ids`; a head model's `token_type_ids=None` (its backbone call) binds; token types given leave the
    call to the eager model, whose check refuses non-zero ones."""
    from hfbert.inference.compiled import _bound

    model, _ = mpnet_pair(num_hidden_layers=1)
    hfbert.optimize_for_inference(model, quantize="int8", compile=True)
    ids, positions = torch.tensor([[0, 7, 2]]), torch.tensor([[2, 3, 4]])
    assert _bound(model, (ids, None, positions), {})["position_ids"] is positions
    assert set(_bound(model, (), dict(input_ids=ids, token_type_ids=None))) == {"self", "input_ids"}
    assert _bound(model, (), dict(input_ids=ids, token_type_ids=torch.zeros_like(ids))) is None
    with torch.no_grad(), pytest.raises(ValueError, match="token_type_ids: MPNet has no token types"):
        model(input_ids=ids, token_type_ids=torch.ones_like(ids))
    assert hfbert.inference.compiled.compile_report(model) == {}
