"""CTranslate2: a converted model folder (`model.bin`, `config.json`) as `ctranslate2.Encoder` on the CPU, with
compute_type "default": the type it was converted to where the CPU computes in it, else CTranslate2 converts the
weights at load (float16 and bfloat16 run as float32 on CPUs, whose compute types are int8 and float32; the values
stay rounded to 16 bits). The report gives both: the weights' precision as model.bin stores them, and the compute
type that ran. It takes ragged token ids and token types and pads by itself."""

from __future__ import annotations

import logging
import math
import os
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import Tensor

from converters.json_files import read_json_object
from hfbert.tools.parity.engines import base
from hfbert.tools.parity.engines.base import ArtifactError

NAME = "CTranslate2"


def accepts(path: Path) -> bool:
    return path.is_dir() and (path / "model.bin").is_file()


def import_ctranslate2() -> Any:
    """CTranslate2, imported so that it runs on its own OpenMP runtime.

    Its wheel bundles a copy of libgomp, but imported plainly its library binds its OpenMP calls to the libgomp that
    torch already made global in the process (LD_DEBUG=bindings shows `GOMP_parallel` bound to torch's copy). One
    runtime then manages torch's thread pool and CTranslate2's: more threads than cores, so libgomp stops spinning
    between parallel regions and every torch kernel in the process, hfbert's and transformers', sleeps and wakes at
    each one (twice as slow after CTranslate2's first call). RTLD_DEEPBIND makes CTranslate2's libraries look in
    their own dependencies first, so it gets its own libgomp and torch's stays torch's."""
    if "ctranslate2" in sys.modules:
        return sys.modules["ctranslate2"]
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | getattr(os, "RTLD_DEEPBIND", 0))
    try:
        return base.import_engine("ctranslate2", NAME)
    finally:
        sys.setdlopenflags(flags)


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


# model.bin's variable types by their code: ctranslate2's DataType enum (include/ctranslate2/types.h), the order of
# ctranslate2.specs.model_spec._dtype_to_type_id, which writes them.
STORED_TYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
BINARY_VERSION = 6  # the layout read here (CTranslate2 4.x writes it); another leaves the weights' precision unknown


def stored_values(model_bin: Path) -> dict[str, int]:
    """The number of values per type of the variables in a CTranslate2 model.bin, reading only their headers
    (version, spec name, revision, count; per variable: name, rank, dims, type code, byte count, then the bytes,
    skipped); {} for a layout other than `BINARY_VERSION` or a file cut short."""
    counts: dict[str, int] = {}
    try:
        with open(model_bin, "rb") as file:

            def read(layout: str) -> tuple:
                size = struct.calcsize("<" + layout)
                data = file.read(size)
                if len(data) != size:
                    raise ValueError("cut short")
                return struct.unpack("<" + layout, data)

            def skip_string() -> None:
                file.seek(read("H")[0], os.SEEK_CUR)

            if read("I")[0] != BINARY_VERSION:
                return {}
            skip_string()
            read("I")
            for _ in range(read("I")[0]):
                skip_string()
                dims = read(f"{read('B')[0]}I")
                code, size = read("BI")
                file.seek(size, os.SEEK_CUR)
                if code < len(STORED_TYPES):
                    counts[STORED_TYPES[code]] = counts.get(STORED_TYPES[code], 0) + math.prod(dims)
    except (OSError, ValueError, struct.error):
        return {}
    return counts


CHOICES = ("Selected ISA", "Use Intel MKL", "SGEMM backend", "GEMM_S8 backend", "Selected compute type")


def load(
    path: Path, hidden_size: int, threads: int, precision: str = "f32", compute_type: str = "default"
) -> base.ArtifactEngine:
    """`precision` is OpenVINO's hint, not CTranslate2's: it runs `compute_type`, by default the type it was converted
    to (a benchmark asks for "int8" of a float32 model, quantized at load)."""
    ctranslate2 = import_ctranslate2()
    config = read_json_object(path / "config.json", missing_ok=True, error=ArtifactError)
    if config.get("decoder_start_token") is not None:
        raise ArtifactError(f"{path}: a CTranslate2 sequence-to-sequence or decoder model; expected an encoder")
    try:
        with captured_log(ctranslate2) as log:
            encoder = ctranslate2.Encoder(str(path), device="cpu", compute_type=compute_type, intra_threads=threads)
            lines = log()
    except Exception as error:
        reason = base.reason_of(error)
        raise ArtifactError(
            f"{path}: CTranslate2 cannot load it as an encoder ({reason}); expected a BERT encoder"
        ) from None
    chosen = "; ".join(line.rsplit("] ", 1)[-1].strip(" -") for line in lines if any(c in line for c in CHOICES))
    weights, ran = base.weight_precision(stored_values(path / "model.bin")), str(encoder.compute_type)
    notes = [chosen] if chosen else []
    if weights and "fp32" not in weights and "float32" in ran:
        supported = ", ".join(sorted(ctranslate2.get_supported_compute_types("cpu")))
        notes.append(f"{weights} weights converted to {ran} at load (this CPU's compute types: {supported})")

    def feed(batch: dict[str, Tensor]) -> tuple[list[list[int]], list[list[int]], int]:
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        tokens = [row[:length].tolist() for row, length in zip(batch["input_ids"], lengths, strict=True)]
        types = [row[:length].tolist() for row, length in zip(batch["token_type_ids"], lengths, strict=True)]
        return tokens, types, batch["input_ids"].shape[1]

    def call(ragged: tuple[list[list[int]], list[list[int]], int]) -> dict[str, Tensor]:
        tokens, types, sequence = ragged
        output = encoder.forward_batch(tokens, token_type_ids=types)  # its errors are named by the caller
        last = torch.from_numpy(numpy.array(output.last_hidden_state))
        if last.dim() == 3 and last.shape[1] < sequence:  # padded to its longest only
            last = torch.nn.functional.pad(last, (0, 0, 0, sequence - last.shape[1]))
        named = {"last_hidden_state": last}
        if output.pooler_output is not None:
            named["pooler_output"] = torch.from_numpy(numpy.array(output.pooler_output))
        return named

    return base.ArtifactEngine(
        path=path,
        engine=NAME,
        version=base.installed_version("ctranslate2"),
        precision=ran,
        inputs=("input_ids", "attention_mask", "token_type_ids"),
        hidden_size=hidden_size,
        feed=feed,
        call=call,
        graph={"int8": ["int8 weights"]} if "int8" in ran else {},
        notes=notes,
        weights=weights,
        weights_remedy="convert without quantization (ct2-transformers-converter --quantization float32)",
        native=encoder,
    )
