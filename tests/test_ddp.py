"""Fine-tuning under DistributedDataParallel: 2 CPU processes, gloo backend, `find_unused_parameters=False`.

Two models, each with and without gradient checkpointing:
  * "classifier": hfbert.BertForSequenceClassification (uses the pooler), loaded with from_pretrained;
  * "no-pooler": hfbert.BertModel(add_pooling_layer=False) with a torch.nn.Linear head on [CLS] (a custom module).

Each rank runs its half of a global batch of 8 padded sequences of varied lengths (padded to its own longest
sequence), with a mean loss over its equal-sized half, so the gradients DDP averages must equal the gradients of
the mean loss over the whole batch in one process (computed here, in the test process, without checkpointing).
Then one AdamW step and a second iteration: the ranks must hold identical parameters, and DDP (which raises in the
next iteration when a parameter got no gradient, since find_unused_parameters=False) must not complain.
A negative control (a BertModel *with* pooler under a [CLS] head) checks that DDP really does raise on an unused
pooler, so that second iteration is a real check.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hfbert

WORLD_SIZE = 2
TOLERANCE = 1e-6  # max abs gradient difference, fp32
CONFIG = dict(
    hidden_size=32,
    num_attention_heads=2,
    num_hidden_layers=2,
    intermediate_size=64,
    vocab_size=100,
    type_vocab_size=2,
    max_position_embeddings=64,
    num_labels=3,
    # No dropout: the DDP run and the single-process run must compute the same function.
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    classifier_dropout=0.0,
)
KINDS = ("classifier", "no-pooler")
CASES = [(kind, checkpointing) for kind in KINDS for checkpointing in (False, True)]


class ClsHeadClassifier(nn.Module):
    """A user's own head: a linear layer on the [CLS] hidden state of a backbone without pooler."""

    def __init__(self, config: hfbert.BertConfig, add_pooling_layer: bool = False) -> None:
        super().__init__()
        self.bert = hfbert.BertModel(config, add_pooling_layer=add_pooling_layer)
        self.head = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits = self.head(hidden.last_hidden_state[:, 0])
        return nn.functional.cross_entropy(logits, labels)


def global_batch() -> list[dict[str, torch.Tensor]]:
    """8 sequences of varied lengths ([CLS] ... [SEP] of random ids, some with a second segment), unpadded."""
    generator = torch.Generator().manual_seed(1)
    examples = []
    for index, length in enumerate([12, 5, 9, 3, 17, 7, 10, 4]):
        input_ids = torch.randint(5, CONFIG["vocab_size"], (length,), generator=generator)
        input_ids[0], input_ids[-1] = 2, 3
        token_type_ids = torch.zeros(length, dtype=torch.long)
        if index % 2:
            token_type_ids[length // 2 :] = 1
        label = torch.randint(0, CONFIG["num_labels"], (), generator=generator)
        examples.append(dict(input_ids=input_ids, token_type_ids=token_type_ids, labels=label))
    return examples


def collate(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad with id 0 to the longest sequence of these examples."""
    width = max(len(example["input_ids"]) for example in examples)
    batch = {
        key: torch.zeros(len(examples), width, dtype=torch.long)
        for key in ("input_ids", "attention_mask", "token_type_ids")
    }
    for row, example in enumerate(examples):
        length = len(example["input_ids"])
        batch["input_ids"][row, :length] = example["input_ids"]
        batch["token_type_ids"][row, :length] = example["token_type_ids"]
        batch["attention_mask"][row, :length] = 1
    batch["labels"] = torch.stack([example["labels"] for example in examples])
    return batch


def randomize(model: nn.Module, seed: int) -> None:
    """Large-ish random weights (as support.helpers.randomize_weights does), so that wrong gradients show."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(1.0 + 0.1 * noise if name.endswith("LayerNorm.weight") else 0.1 * noise)


def load(kind: str, directory: Path) -> nn.Module:
    """The model in train mode with the weights the test process wrote."""
    if kind == "classifier":
        # from_pretrained returns eval mode: without .train() checkpointing would silently be off.
        model = hfbert.BertForSequenceClassification.from_pretrained(directory / "classifier")
    else:
        model = ClsHeadClassifier(hfbert.BertConfig(**CONFIG))
        model.load_state_dict(torch.load(directory / "no-pooler.pt"))
    return model.train()


def loss_of(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    output = model(**batch)
    return output if isinstance(output, torch.Tensor) else output.loss


def gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.grad.detach().clone() for name, parameter in model.named_parameters()}


def worker(rank: int, port: int, directory: Path) -> None:
    """One DDP process: every case in turn in the same process group; writes what it saw to rank{rank}.pt."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=timedelta(seconds=60),
    )
    examples = global_batch()
    half = len(examples) // WORLD_SIZE
    batch = collate(examples[rank * half : (rank + 1) * half])
    results = {}
    for kind, checkpointing in CASES:
        model = load(kind, directory)
        if checkpointing and kind == "classifier":
            model.gradient_checkpointing_enable()
        elif checkpointing:
            model.bert.gradient_checkpointing_enable()
        # Count calls of one layer: checkpointing recomputes it during backward (2 calls per step). A pre-hook,
        # since the recomputation stops early, once it has what backward needs, and never reaches forward hooks;
        # on a submodule, since the layer's own hooks run once per step, outside its checkpoint (as transformers').
        calls = []
        model.bert.encoder.layer[0].attention.register_forward_pre_hook(lambda *_, calls=calls: calls.append(1))
        ddp = DistributedDataParallel(model, find_unused_parameters=False)
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        loss = loss_of(ddp, batch)
        loss.backward()
        first_gradients = gradients(model)
        layer_calls = len(calls)
        optimizer.step()
        optimizer.zero_grad()
        # A second iteration: with find_unused_parameters=False DDP raises here if a parameter got no gradient.
        loss_of(ddp, batch).backward()
        optimizer.step()
        results[kind, checkpointing] = dict(
            loss=loss.detach(),
            gradients=first_gradients,
            layer_calls=layer_calls,
            parameters={name: parameter.detach().clone() for name, parameter in model.named_parameters()},
        )

    # Negative control: a pooler that no loss uses. DDP must raise at the start of the second iteration.
    torch.manual_seed(0)
    ddp = DistributedDataParallel(ClsHeadClassifier(hfbert.BertConfig(**CONFIG), add_pooling_layer=True))
    loss_of(ddp, batch).backward()
    try:
        loss_of(ddp, batch).backward()
        results["unused pooler error"] = None
    except RuntimeError as error:
        results["unused pooler error"] = str(error)
    torch.save(results, directory / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Write the initial weights, run the 2-process DDP job, compute the single-process references."""
    directory = tmp_path_factory.mktemp("ddp")
    config = hfbert.BertConfig(**CONFIG)
    classifier = hfbert.BertForSequenceClassification(config)
    randomize(classifier, seed=0)
    classifier.save_pretrained(directory / "classifier")
    no_pooler = ClsHeadClassifier(config)
    randomize(no_pooler, seed=1)
    torch.save(no_pooler.state_dict(), directory / "no-pooler.pt")

    mp.spawn(worker, args=(free_port(), directory), nprocs=WORLD_SIZE, join=True)
    ranks = [torch.load(directory / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]

    full_batch = collate(global_batch())
    half = len(full_batch["labels"]) // WORLD_SIZE
    halves = [{key: value[i * half : (i + 1) * half] for key, value in full_batch.items()} for i in range(WORLD_SIZE)]
    references = {}
    for kind in KINDS:
        model = load(kind, directory)
        loss = loss_of(model, full_batch)
        loss.backward()
        references[kind] = dict(loss=loss.detach(), gradients=gradients(model))
        # Gradients of rank 0's half alone: what each rank would keep if DDP did not all-reduce.
        model.zero_grad()
        loss_of(model, halves[0]).backward()
        references[kind]["rank 0 half"] = gradients(model)
    return dict(ranks=ranks, references=references)


def max_gradient_difference(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    assert ours.keys() == reference.keys()
    return max(float((ours[name] - reference[name]).abs().max()) for name in reference)


@pytest.mark.parametrize("kind, checkpointing", CASES, ids=[f"{k}-checkpointing={c}" for k, c in CASES])
def test_ddp_gradients_equal_single_process_gradients(runs, kind, checkpointing):
    reference = runs["references"][kind]
    results = [rank[kind, checkpointing] for rank in runs["ranks"]]
    # Checkpointing was really on (layer recomputed in backward) or really off.
    assert [result["layer_calls"] for result in results] == [2 if checkpointing else 1] * WORLD_SIZE
    # The mean of the two per-rank losses is the full-batch mean loss.
    mean_loss = sum(result["loss"] for result in results) / WORLD_SIZE
    assert abs(float(mean_loss - reference["loss"])) <= TOLERANCE
    # After the all-reduce both ranks hold the same gradients, and they are the full-batch gradients.
    for name, gradient in results[0]["gradients"].items():
        assert torch.equal(gradient, results[1]["gradients"][name]), name
    difference = max_gradient_difference(results[0]["gradients"], reference["gradients"])
    largest = max(float(gradient.abs().max()) for gradient in reference["gradients"].values())
    print(f"{kind}, checkpointing={checkpointing}: max abs grad difference {difference:.2e}, max |grad| {largest:.2f}")
    assert difference <= TOLERANCE
    # The test can tell: one rank's half-batch gradients (no all-reduce) are far from the full-batch ones.
    assert max_gradient_difference(reference["rank 0 half"], reference["gradients"]) > 1e-3
    # Every parameter gets a gradient (the pooler-less model has no parameter outside the loss).
    assert all(float(gradient.abs().max()) > 0 for gradient in reference["gradients"].values())


@pytest.mark.parametrize("kind, checkpointing", CASES, ids=[f"{k}-checkpointing={c}" for k, c in CASES])
def test_ddp_ranks_stay_identical_after_optimizer_steps(runs, kind, checkpointing):
    first, second = (rank[kind, checkpointing]["parameters"] for rank in runs["ranks"])
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_ddp_raises_on_an_unused_pooler(runs):
    """The control: with find_unused_parameters=False, DDP does fail when a parameter (here the pooler) is
    unused, so the second iteration above is a real check that the pooler-less model has none."""
    for rank in runs["ranks"]:
        error = rank["unused pooler error"]
        assert error is not None
        assert "pooler" in error or "finished reduction" in error
