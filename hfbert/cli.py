"""The `hfbert` command line: download, convert and inspect BERT checkpoints.

    hfbert download google-bert/bert-base-uncased [--revision R] [--cache-dir D] [--offline]
    hfbert convert SRC DEST [--dtype float32|float16|bfloat16] [--max-shard-size 2GB]
    hfbert inspect SRC

Exit code 0 on success; on failure, 1 with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hfbert", description="Download, convert and inspect BERT checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True)

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    try:
        arguments.run(arguments)
    except (ValueError, OSError) as error:  # CheckpointError and ConfigError are ValueErrors
        print(f"hfbert {arguments.command}: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
