"""How busy other processes kept the machine's cores while a benchmark ran, and the rule for publishing its result.

On a shared machine every timing also measures the neighbours (and the measured kernel choice, timed in-process,
may pick differently). Each benchmark records `others_cores`: the average number of cores that processes other
than itself and its children kept busy during the run, from the machine's busy time in /proc/stat minus this
process's own CPU time (`os.times`). `--update-docs` publishes a result only when that stays at or below
`BUSY_LIMIT` cores: the run is refused before it starts when a short sample already shows more, and its result is
not written to docs/ when the run as a whole had more. `--allow-busy` publishes anyway; the result then carries
`busy_forced: true` and its rendered table says so (benchmarks/report.py, which imports this standard-library-only
module without torch).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

BUSY_LIMIT = 0.3  # cores that other processes may keep busy, on average, during a published run
SAMPLE_SECONDS = 3.0  # the sample taken before a run that will publish


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds the whole machine has been busy, CPU seconds of this process and its waited-for children),
    Linux only."""
    if not Path("/proc/stat").exists():
        return None
    fields = [int(value) for value in Path("/proc/stat").read_text().split()[1:9]]
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    own = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system + own.children_user + own.children_system


def others_cores(before, after, seconds: float) -> float | None:
    """Cores that other processes kept busy on average between two `cpu_seconds()` readings `seconds` apart."""
    if before is None or after is None or seconds <= 0:
        return None
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / seconds)


class BusyMeter:
    """Counts from its creation; `cores()`: the cores other processes kept busy on average since then."""

    def __init__(self) -> None:
        self.started, self.before = time.perf_counter(), cpu_seconds()

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def cores(self) -> float | None:
        return others_cores(self.before, cpu_seconds(), self.seconds())


def add_allow_busy_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-busy",
        action="store_true",
        help=f"with --update-docs: publish even when other processes kept more than {BUSY_LIMIT} of a core busy "
        "(the docs then say the result was forced)",
    )


def _refusal(cores: float, when: str) -> str:
    return (
        f"other processes kept {cores:.2f} cores busy {when}, more than the {BUSY_LIMIT} a result published in docs/ "
        "may have: its times would be skewed. Nothing was written to docs/; rerun on an idle machine, or pass "
        "--allow-busy to publish it marked as forced"
    )


def refuse_busy_start(update_docs: bool, allow_busy: bool) -> None:
    """Before a run that will publish: SystemExit when other processes keep more than `BUSY_LIMIT` cores busy now
    (a `SAMPLE_SECONDS` sample), so that a long run is not spent on numbers that would then be refused."""
    if not update_docs or allow_busy:
        return
    meter = BusyMeter()
    time.sleep(SAMPLE_SECONDS)
    cores = meter.cores()
    if cores is not None and cores > BUSY_LIMIT:
        raise SystemExit(_refusal(cores, f"over the last {SAMPLE_SECONDS:g} s before the run"))


def settle(records: list[dict], allow_busy: bool) -> None:
    """Before a result is written to docs/results/: SystemExit when a machine record's `others_cores` is over
    `BUSY_LIMIT`, unless `allow_busy`, which marks every record `busy_forced`."""
    worst = max((record.get("others_cores") or 0.0 for record in records), default=0.0)
    if worst <= BUSY_LIMIT:
        return
    if not allow_busy:
        raise SystemExit(_refusal(worst, "during the run"))
    for record in records:
        record["busy_forced"] = True


def over_limit(record: dict) -> bool:
    return (record.get("others_cores") or 0.0) > BUSY_LIMIT
