"""CTranslate2: a converted model folder (`model.bin`, `config.json`) as `ctranslate2.Encoder` on the CPU, at the
compute type it was converted to. It takes ragged token ids and token types and pads by itself."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import Tensor

from hfbert.tools.extras import MissingExtraError
from hfbert.tools.parity.engines.base import INSTALL_DEPLOY, ArtifactEngine, ArtifactError, installed_version, reason_of

NAME = "CTranslate2"


def accepts(path: Path) -> bool:
    return path.is_dir() and (path / "model.bin").is_file()


def import_ctranslate2() -> Any:
    """CTranslate2, imported so that it runs on its own OpenMP runtime.

    Its wheel bundles a copy of libgomp, but imported plainly its library binds its OpenMP calls to the libgomp that
    torch already made global in the process (LD_DEBUG=bindings shows `GOMP_parallel` bound to torch's copy). One
    runtime then manages torch's thread pool and CTranslate2's: more threads than cores, so libgomp stops spinning
    between parallel regions (its throttled spin count) and every torch kernel in the process, hfbert's and
    transformers', sleeps and wakes at each one: hfbert 1 x 16 took 23 ms before CTranslate2's first call and 46 ms
    after it (48,000 context switches in 40 calls against none). RTLD_DEEPBIND makes CTranslate2's libraries look
    in their own dependencies first, so it gets its own libgomp and torch's stays torch's (23 ms after, and
    CTranslate2 itself is no slower)."""
    if "ctranslate2" not in sys.modules:
        flags = sys.getdlopenflags()
        sys.setdlopenflags(flags | getattr(os, "RTLD_DEEPBIND", 0))
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            raise MissingExtraError(f"{NAME} is not installed (needed for this artifact): {INSTALL_DEPLOY}") from None
        finally:
            sys.setdlopenflags(flags)
    return sys.modules["ctranslate2"]


@contextmanager
def captured_log(ctranslate2: Any) -> Iterator[Callable[[], list[str]]]:
    """CTranslate2's INFO log lines (the instruction set, GEMM backend and compute type it chose). It is written by
    C++ to file descriptor 2, which redirecting sys.stderr would miss, so the descriptor itself is pointed at a file."""
    with tempfile.TemporaryFile(mode="w+") as sink:
        before, saved = ctranslate2.get_log_level(), os.dup(2)
        ctranslate2.set_log_level(logging.INFO)
        sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        try:
            yield lambda: (sink.seek(0), sink.read().splitlines())[1]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            ctranslate2.set_log_level(before)


CHOICES = ("Selected ISA", "Use Intel MKL", "SGEMM backend", "GEMM_S8 backend", "Selected compute type")


def load(path: Path, hidden_size: int, threads: int, precision: str = "f32") -> ArtifactEngine:
    ctranslate2 = import_ctranslate2()
    try:
        config = (
            json.loads((path / "config.json").read_text(encoding="utf-8")) if (path / "config.json").is_file() else {}
        )
    except (ValueError, RecursionError) as error:  # RecursionError: nested too deeply
        reason = " ".join(str(error).split())[:200] if isinstance(error, ValueError) else "nested too deeply"
        raise ArtifactError(f"{path / 'config.json'}: not valid JSON ({reason})") from None
    if not isinstance(config, dict):
        raise ArtifactError(f"{path / 'config.json'}: expected a JSON object, got {type(config).__name__}")
    if config.get("decoder_start_token") is not None:
        raise ArtifactError(f"{path}: a CTranslate2 sequence-to-sequence or decoder model; expected an encoder")
    try:
        with captured_log(ctranslate2) as log:
            encoder = ctranslate2.Encoder(str(path), device="cpu", compute_type="default", intra_threads=threads)
            lines = log()
    except Exception as error:
        reason = reason_of(error)
        raise ArtifactError(
            f"{path}: CTranslate2 cannot load it as an encoder ({reason}); expected a BERT encoder"
        ) from None
    chosen = "; ".join(line.rsplit("] ", 1)[-1].strip(" -") for line in lines if any(c in line for c in CHOICES))

    def forward(batch: dict[str, Tensor]) -> dict[str, Tensor]:
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        tokens = [row[:length].tolist() for row, length in zip(batch["input_ids"], lengths, strict=True)]
        types = [row[:length].tolist() for row, length in zip(batch["token_type_ids"], lengths, strict=True)]
        try:
            output = encoder.forward_batch(tokens, token_type_ids=types)
        except Exception as error:
            raise ArtifactError(f"{path}: CTranslate2 failed on a batch ({error}); expected a BERT encoder") from None
        last = torch.from_numpy(numpy.array(output.last_hidden_state))
        if last.dim() == 3 and last.shape[1] < batch["input_ids"].shape[1]:  # padded to its longest only
            last = torch.nn.functional.pad(last, (0, 0, 0, batch["input_ids"].shape[1] - last.shape[1]))
        named = {"last_hidden_state": last}
        if output.pooler_output is not None:
            named["pooler_output"] = torch.from_numpy(numpy.array(output.pooler_output))
        return named

    return ArtifactEngine(
        path=path,
        engine=NAME,
        version=installed_version("ctranslate2"),
        precision=str(encoder.compute_type),
        inputs=("input_ids", "attention_mask", "token_type_ids"),
        hidden_size=hidden_size,
        forward=forward,
        graph={"int8": ["int8 weights"]} if "int8" in str(encoder.compute_type) else {},
        notes=[chosen] if chosen else [],
    )
