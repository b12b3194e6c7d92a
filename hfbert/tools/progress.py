"""Progress on stderr: a tqdm bar on a terminal, plain lines everywhere else (CI logs, `2> log.txt`).

A bar redrawn with carriage returns is unreadable in a log file, and tqdm's own default (`disable=None`) prints
nothing at all when stderr is not a terminal, so a job in CI looked stuck for minutes. Off a terminal, a line such
as `parity: 12/48 batch (25%), 0:31 elapsed, 0.4 batch/s, backbone` is printed every `LOG_INTERVAL` seconds, and
once more when a job that printed one ends, unless its last line already gave the final count (a log shows each
count once); a job shorter than that prints none (so a failure stays one line).
`TQDM_DISABLE=1` or `HF_HUB_DISABLE_PROGRESS_BARS=1` silence both, as they silence tqdm and huggingface_hub.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

LOG_INTERVAL = 30.0  # seconds between two progress lines off a terminal


def _silenced() -> bool:
    names = ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in names)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class Progress:
    """`update(n)`, `set_postfix_str(text)`, `close()`, like a tqdm bar. `total` None: unknown (a pipe)."""

    def __init__(self, total: int | None, description: str, unit: str, *, enabled: bool = True) -> None:
        self.total, self.description, self.unit = total, description, unit
        self.count, self.postfix, self.printed = 0, "", False
        self.shown: int | None = None  # the count the last line gave
        self.started = self.last = time.monotonic()
        shown = enabled and not _silenced()
        self.lines = shown and not sys.stderr.isatty()
        self.bar: Any = None
        if shown and sys.stderr.isatty():
            from tqdm.auto import tqdm

            # tqdm writes the unit right after the count ("0document"): a space keeps them apart ("12 document").
            self.bar = tqdm(total=total, desc=description, unit=f" {unit}", file=sys.stderr)

    def _line(self) -> None:
        elapsed = time.monotonic() - self.started
        done = f"{self.count}/{self.total} {self.unit}" if self.total is not None else f"{self.count} {self.unit}"
        if self.total:
            done += f" ({100 * self.count / self.total:.0f}%)"
        rate = f", {self.count / elapsed:.3g} {self.unit}/s" if elapsed > 0 and self.count else ""
        postfix = f", {self.postfix}" if self.postfix else ""
        print(f"{self.description}: {done}, {_clock(elapsed)} elapsed{rate}{postfix}", file=sys.stderr, flush=True)
        self.last, self.printed, self.shown = time.monotonic(), True, self.count

    def update(self, count: int = 1) -> None:
        self.count += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.lines and time.monotonic() - self.last >= LOG_INTERVAL:
            self._line()

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.lines and self.printed and self.shown != self.count:
            self._line()
        self.lines = False
