"""The `hfbert` command line: download, convert, inspect, check parity, embed, fill masks.

    hfbert download google-bert/bert-base-uncased [--revision R] [--cache-dir D] [--offline]
    hfbert convert SRC DEST [--dtype float32|float16|bfloat16] [--max-shard-size 2GB]
    hfbert inspect SRC
    hfbert parity MODEL [--device cpu|cuda] [--dtype float32|bfloat16|float16] [--attn eager|sdpa] [--texts FILE]
                        [--batch-size N] [--reference MODEL2] [--linear standard|packed|onednn] [--tolerance ABS]
                        [--json OUT.json] [--plot OUT.png]
    hfbert embed MODEL [TEXT ...] [--file F] [--pooling cls|mean] [--normalize] [--quantize int8] [--out F.npy|F.jsonl]
                       [--batch-size N] [--max-length N] [--chunk-size N] [--device D] [--dtype T]
    hfbert fill-mask MODEL "Paris is the [MASK] of France." [--top-k 5] [--device D] [--json]

Exit code 0 on success; on failure, 1 with a one-line reason on stderr (`parity`: 1 also when an output is
less accurate than transformers' own against float64, see hfbert/parity.py). 2 when an optional dependency is
missing (the message says what to install).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from hfbert.atomic_write import exit_on_sigterm


def download_command(arguments: argparse.Namespace) -> None:
    from converters.hub import download

    snapshot = download(
        arguments.repo_id,
        arguments.revision,
        cache_dir=arguments.cache_dir,
        offline=arguments.offline,
        include_tokenizer=True,
    )
    for name in snapshot.files:
        verified = snapshot.verified_sha256.get(name)
        print(f"  {name:<36} {'sha256 ' + verified + ' verified' if verified else ''}".rstrip())
    print(f"revision  {snapshot.commit}")
    print(f"snapshot  {snapshot.directory}")


def convert_command(arguments: argparse.Namespace) -> None:
    from converters.convert import DTYPES, convert

    written = convert(
        arguments.source,
        arguments.destination,
        dtype=DTYPES[arguments.dtype] if arguments.dtype else None,
        max_shard_size=arguments.max_shard_size,
    )
    print(f"wrote {arguments.destination}: {', '.join(written)}")


def inspect_command(arguments: argparse.Namespace) -> None:
    from converters.hub import resolve_checkpoint
    from converters.inspection import describe

    print(describe(resolve_checkpoint(arguments.source, include_tokenizer=True)))


def parity_command(arguments: argparse.Namespace) -> int:
    from hfbert.parity import import_pyplot, read_texts, run_parity

    if arguments.plot:
        import_pyplot()  # fail before the run, not after it
    for option, path in (("--json", arguments.json), ("--plot", arguments.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise ValueError(f"{option} {path}: the folder {Path(path).resolve().parent} does not exist")
    report = run_parity(
        arguments.model,
        device=arguments.device,
        dtype=arguments.dtype,
        attn=arguments.attn,
        texts=read_texts(arguments.texts) if arguments.texts else None,
        batch_size=arguments.batch_size,
        reference=arguments.reference,
        linear_kernel=arguments.linear,
        tolerance=arguments.tolerance,
    )
    print(report.table())
    if arguments.json:
        report.write_json(arguments.json)
        print(f"wrote {arguments.json}")
    if arguments.plot:
        report.plot(arguments.plot)
        print(f"wrote {arguments.plot}")
    return 0 if report.passed else 1


def embed_command(arguments: argparse.Namespace) -> None:
    from hfbert.atomic_write import refuse_same_file
    from hfbert.embedding import Embedder, count_lines, embed_file, output_kind, read_texts

    if bool(arguments.texts) == bool(arguments.file):
        raise ValueError("give the texts either as arguments or with --file, not both and not neither")
    output_kind(arguments.out)  # a wrong suffix fails before the model loads
    refuse_same_file(arguments.out, {"--file": arguments.file})
    device = arguments.device
    if device == "cuda" and "LOCAL_RANK" in os.environ:  # torchrun: one GPU per process
        device = f"cuda:{os.environ['LOCAL_RANK']}"
    embedder = Embedder(
        arguments.model,
        pooling=arguments.pooling,
        normalize=arguments.normalize,
        batch_size=arguments.batch_size,
        max_length=arguments.max_length,
        device=device,
        dtype=arguments.dtype,
        quantize=arguments.quantize,
    )
    if arguments.file:
        texts, total = read_texts(arguments.file), count_lines(arguments.file)
    else:
        texts, total = arguments.texts, len(arguments.texts)
    embed_file(embedder, texts, total, arguments.out, chunk_size=arguments.chunk_size)
    if arguments.out and os.environ.get("RANK", "0") == "0":
        print(f"wrote {total} embeddings of size {embedder.dimension} to {arguments.out}", file=sys.stderr)


def fill_mask_command(arguments: argparse.Namespace) -> None:
    import json

    import hfbert

    model, info = hfbert.BertForMaskedLM.from_pretrained(
        arguments.model, device=arguments.device, output_loading_info=True
    )
    if info["report"].new_head:
        raise ValueError(f"{arguments.model}: the checkpoint has no masked-LM head (no cls.predictions.* tensors)")
    tokenizer = hfbert.BertTokenizer.from_pretrained(model.name_or_path)
    predictions = model.fill_mask(arguments.text, tokenizer, top_k=arguments.top_k)
    if arguments.json:
        print(json.dumps(predictions, ensure_ascii=False))
        return
    width = max(len(repr(prediction["token_str"])) for prediction in predictions)
    print(f"{'token':<{width}}  {'score':>7}  sequence")
    for prediction in predictions:
        print(f"{prediction['token_str']!r:<{width}}  {prediction['score']:>7.4f}  {prediction['sequence']}")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), like every other hfbert failure."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def positive_integer(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def compute_device(text: str) -> str:
    """argparse type: "cpu", "cuda" or "cuda:N" naming a GPU this machine has."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: hfbert runs on cpu or cuda (cuda:N), not {device.type}")
    if device.type == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has no CUDA GPU usable by torch")
        if device.index is not None and device.index >= available:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {available} CUDA GPU(s): cuda:0 ...")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="hfbert", description="Download, convert and inspect BERT checkpoints; check parity, embed, fill masks."
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)

    download = commands.add_parser("download", help="download (and verify) what hfbert loads from a Hub repo")
    download.add_argument("repo_id")
    download.add_argument("--revision", help="branch, tag or commit sha (default: main)")
    download.add_argument("--cache-dir", help="cache directory (default: HF_HUB_CACHE)")
    download.add_argument("--offline", action="store_true", help="use the cache only; no network call at all")
    download.set_defaults(run=download_command)

    convert = commands.add_parser("convert", help="write a canonical Hugging Face checkpoint, atomically")
    convert.add_argument("source", help="local directory or Hub repo id")
    convert.add_argument("destination", help="new directory to create")
    convert.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="cast floating-point tensors")
    convert.add_argument("--max-shard-size", default="2GB", help="largest safetensors file (default: 2GB)")
    convert.set_defaults(run=convert_command)

    inspect = commands.add_parser("inspect", help="config, files, tensors and what the key map does to them")
    inspect.add_argument("source", help="local directory or Hub repo id")
    inspect.set_defaults(run=inspect_command)

    parity = commands.add_parser("parity", help="compare every layer with transformers on real sentences")
    parity.add_argument("model", help="local directory or Hub repo id")
    parity.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu or cuda (default: cpu)")
    parity.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parity.add_argument(
        "--attn",
        choices=["eager", "sdpa"],
        default="sdpa",
        help="attention implementation of both models (default: sdpa; attention probabilities then come from an "
        "extra eager pass)",
    )
    parity.add_argument(
        "--texts", metavar="FILE", help="your own sentences, one per line (default: the shipped battery)"
    )
    parity.add_argument(
        "--batch-size", metavar="N", type=positive_integer, default=8, help="sequences per padded batch (default: 8)"
    )
    parity.add_argument(
        "--reference",
        metavar="MODEL2",
        help="load transformers from this checkpoint instead of MODEL (e.g. the original of a converted copy)",
    )
    parity.add_argument(
        "--linear",
        choices=["standard", "packed", "onednn"],
        default="standard",
        help="hfbert's linear layers: standard (F.linear, transformers' kernel; the default), packed (weights packed "
        "by hfbert.optimize_for_inference, the fast path) or onednn (unpacked oneDNN, opt-in: less accurate than the "
        "contract allows, see hfbert/linear.py)",
    )
    parity.add_argument(
        "--tolerance",
        metavar="ABS",
        type=float,
        help="also require max abs against transformers <= ABS (the verdict itself compares both with float64)",
    )
    parity.add_argument(
        "--json", metavar="OUT.json", help="write the full report (versions, sha256, every number) to this file"
    )
    parity.add_argument(
        "--plot", metavar="OUT.png", help="draw error per layer, log scale, to this image (needs matplotlib)"
    )
    parity.set_defaults(run=parity_command)

    embed = commands.add_parser("embed", help="embed texts (streamed from a file) into .npy / .jsonl, in order")
    embed.add_argument("model", help="local directory or Hub repo id")
    embed.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed (or use --file)")
    embed.add_argument("--file", metavar="F", help='one text per line, or .jsonl with a "text" field per line')
    embed.add_argument("--pooling", choices=["cls", "mean"], default="mean", help="default: mean over real tokens")
    embed.add_argument("--normalize", action="store_true", help="scale each embedding to unit length")
    embed.add_argument("--out", metavar="F.npy|F.jsonl", help="F.npy or F.jsonl (default: JSON lines on stdout)")
    embed.add_argument(
        "--batch-size", metavar="N", type=positive_integer, default=32, help="texts per batch (default: 32)"
    )
    embed.add_argument(
        "--max-length",
        metavar="N",
        type=positive_integer,
        help="truncate to this many tokens (default: the sentence-transformers "
        "max_seq_length when the checkpoint has one, else max_position_embeddings)",
    )
    embed.add_argument(
        "--chunk-size",
        metavar="N",
        type=positive_integer,
        default=10_000,
        help="lines read, sorted by length and embedded at once (10000)",
    )
    embed.add_argument("--device", type=compute_device, default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    embed.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: as stored")
    embed.add_argument("--quantize", choices=["int8"], help="int8 weights and activations on CPU (faster, lossy)")
    embed.set_defaults(run=embed_command)

    fill_mask = commands.add_parser("fill-mask", help="top-k tokens for the [MASK] in a text")
    fill_mask.add_argument("model", help="local directory or Hub repo id (with a masked-LM head)")
    fill_mask.add_argument("text", help='a text with one [MASK], e.g. "Paris is the [MASK] of France."')
    fill_mask.add_argument("--top-k", metavar="K", type=positive_integer, default=5)
    fill_mask.add_argument("--device", type=compute_device, default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    fill_mask.add_argument("--json", action="store_true", help="print the predictions as one JSON list")
    fill_mask.set_defaults(run=fill_mask_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from hfbert.parity import MissingExtraError

    arguments = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so temporary files and directories are removed on the way out.
    with exit_on_sigterm():
        try:
            return arguments.run(arguments) or 0
        except MissingExtraError as error:
            print(f"hfbert {arguments.command}: {error}", file=sys.stderr)
            return 2
        except (ValueError, OSError) as error:  # CheckpointError and ConfigError are ValueErrors
            print(f"hfbert {arguments.command}: {' '.join(str(error).split())}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"hfbert {arguments.command}: interrupted", file=sys.stderr)
            return 130
        except Exception as error:  # noqa: BLE001 - the promise: one line on stderr for any input, never a traceback
            if os.environ.get("HFBERT_TRACEBACK"):
                raise
            message = " ".join(str(error).split())[:500]
            print(
                f"hfbert {arguments.command}: {type(error).__name__}: {message} (unexpected; set HFBERT_TRACEBACK=1 "
                f"to see where)",
                file=sys.stderr,
            )
            return 1


if __name__ == "__main__":
    sys.exit(main())
