"""What the benchmarks share: their options (`--json`, and for a result rendered into docs/ `--update-docs`,
`--render` and `--allow-busy`; `--quick` and `--threads` where a benchmark has them), the record of the machine a
run measured, and where a result goes (the `--json` file, docs/results/ through benchmarks/report.py, and the
partial saves of a long run)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

import hfbert
from benchmarks import report
from benchmarks.busy import BusyMeter, add_allow_busy_option, over_limit, refuse_busy_start
from hfbert.platform.cpu import cpu_name, instruction_set
from hfbert.platform.mkl import mkl_branch
from hfbert.tools.parity.engines.base import installed_version


def parser(
    doc: str, kind: str | None = None, quick: str | None = None, threads: bool = False
) -> argparse.ArgumentParser:
    """A benchmark's parser with its shared options; `kind`: the docs/results/ result it publishes (report.TARGETS),
    `quick`: the help of its `--quick`."""
    made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if quick:
        made.add_argument("--quick", action="store_true", help=quick)
    if threads:
        made.add_argument("--threads", type=int, default=torch.get_num_threads(), help="default: torch's count")
    made.add_argument("--json", type=Path, help="write every number here")
    if kind:
        made.add_argument(
            "--update-docs", action="store_true", help="write the result to docs/results/ and render it into docs/"
        )
        made.add_argument("--render", type=Path, metavar="JSON", help="no run: render this result into docs/")
        add_allow_busy_option(made)
    return made


def parse(made: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments; a `--json` file whose folder does not exist is refused before a long run, not after it."""
    args = made.parse_args()
    if args.json and not args.json.resolve().parent.is_dir():
        made.error(f"--json {args.json}: the folder {args.json.resolve().parent} does not exist")
    return args


def rendered(args: argparse.Namespace, kind: str) -> bool:
    """`--render JSON`: the result rendered into docs/, and True (nothing to measure). Otherwise False, after refusing
    a run that would publish while other processes keep the cores busy (benchmarks/busy.py)."""
    if args.render:
        report.render_file(kind, args.render, args.allow_busy)
        return True
    refuse_busy_start(args.update_docs, args.allow_busy)
    return False


def machine(threads: int, packages: tuple[str, ...] = ("torch", "transformers")) -> dict[str, Any]:
    """The machine a run measured: CPU, instruction set, MKL's branch, cores and threads, the versions of hfbert and
    `packages`, the load before it started and the date."""
    return {
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "cpu": cpu_name(),
        "instruction_set": instruction_set(),
        "mkl_branch": mkl_branch(),
        "cores": os.cpu_count(),
        "threads": threads,
        "versions": {"hfbert": hfbert.__version__, **{name: installed_version(name) for name in packages}},
        "load_before": os.getloadavg()[0],
    }


def finish(result: dict, meter: BusyMeter) -> dict:
    """The run's time and how busy other processes kept the cores meanwhile, recorded in `result`."""
    result["seconds"] = meter.seconds()
    result["machine"]["others_cores"] = meter.cores()
    return result


def write(args: argparse.Namespace, kind: str | None, result: Any) -> Any:
    """The finished result as its JSON file holds it: written to `--json`, and with `--update-docs` to docs/results/
    and rendered (refused when the cores were too busy, unless `--allow-busy`)."""
    result = json.loads(json.dumps(result, default=str))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    if kind and args.update_docs:
        report.publish(kind, result, args.allow_busy)
    return result


def save_partial(args: argparse.Namespace, kind: str, result: dict) -> None:
    """What a long run has so far (marked partial), where the finished result will go: a run stopped midway still
    leaves its rows to render. Not to docs/ when the cores are too busy for it to be published at the end."""
    destinations = [args.json] if args.json else []
    if args.update_docs and (args.allow_busy or not over_limit(result["machine"])):
        destinations.append(report.RESULTS / f"{report.target(kind, result).name}.json")
    for destination in destinations:
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(json.dumps({**result, "partial": True}, indent=2, default=str) + "\n")
