"""`hfbert ARGUMENTS` run two ways with the same result: in-process (`hfbert.cli.main`, standard input a real pipe on
file descriptor 0, so that `--file -` and `--file /dev/stdin` read what a shell pipe gives), or as `python -m hfbert`
in a fresh process. The `hfbert_command` fixture (conftest.py) runs the first in the default run and the second in
the slow one, so a test of a command's behaviour runs in the default run without paying for a process start."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@contextmanager
def stdin_pipe(data: bytes):
    """File descriptor 0 and sys.stdin read `data` from a pipe, written by a thread (so a large `data` cannot fill
    the pipe and block), until the block ends."""
    read_end, write_end = os.pipe()

    def write() -> None:
        # BrokenPipeError: the command stopped reading, as a shell pipe allows too
        with os.fdopen(write_end, "wb") as pipe, suppress(BrokenPipeError):
            pipe.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    saved_fd, saved_stdin = os.dup(0), sys.stdin
    os.dup2(read_end, 0)
    os.close(read_end)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - closed below
    try:
        yield
    finally:
        sys.stdin.close()
        sys.stdin = saved_stdin
        os.dup2(saved_fd, 0)
        os.close(saved_fd)
        writer.join(timeout=60)


def in_process(capsys, *arguments, stdin: bytes | None = None) -> Ran:
    """`hfbert.cli.main(ARGUMENTS)`; argparse's errors exit through SystemExit, whose code is the exit status."""
    from hfbert.cli import main

    capsys.readouterr()
    arguments = [str(argument) for argument in arguments]
    with stdin_pipe(stdin if stdin is not None else b""):
        try:
            code = main(arguments)
        except SystemExit as exit:
            code = exit.code
    captured = capsys.readouterr()
    return Ran(0 if code is None else int(code), captured.out, captured.err)


def in_subprocess(*arguments, stdin: bytes | None = None, env: dict | None = None) -> Ran:
    """`python -m hfbert ARGUMENTS` in a fresh process, `stdin` on a pipe."""
    command = [sys.executable, "-m", "hfbert", *map(str, arguments)]
    result = subprocess.run(command, input=stdin or b"", capture_output=True, timeout=600, cwd=ROOT, env=env)
    return Ran(result.returncode, result.stdout.decode(), result.stderr.decode())
