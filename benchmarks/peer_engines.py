"""benchmarks/peers.py's engines (hfbert, transformers, ONNX Runtime, OpenVINO, CTranslate2 behind one
`Engine`) and the artifacts they run (ONNX files and the CTranslate2 model, built once per run).
"""

from __future__ import annotations

import functools
import gc
import math
import os
import pickle
import subprocess
import sys
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import hfbert
from benchmarks import report
from benchmarks.artifacts import convert_ctranslate2, export_onnx, fuse_onnx, quantize_onnx
from benchmarks.onednn_verbose import describe as describe_kernels
from benchmarks.onednn_verbose import onednn_kernels
from benchmarks.report import ENGINES, HFBERT_PLAIN, ORT_UNFUSED
from hfbert.inference import packed_layers
from hfbert.inference.compiled import compile_report, eager_shapes, padded_shape
from hfbert.inference.measured import ROW_BUCKETS
from hfbert.platform.cpu import bfloat16_native, instruction_set
from hfbert.platform.mkl import SETTING, SWITCH, mkl_branch
from hfbert.tools.parity.engines import ctranslate2_engine, onnxruntime_engine, openvino_engine

OPENVINO_DEFAULT = f"{openvino_engine.NAME} (default precision)"


# -- progress: lines on stderr with the time and this process's memory ---------------------------------------------
def memory_mib(field_name: str = "VmRSS") -> float:
    """This process's resident memory now (VmRSS) or at its peak (VmHWM), Linux only."""
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    found = [line.split()[1] for line in lines if line.startswith(field_name + ":")]
    return int(found[0]) / 1024 if found else math.nan


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}, {memory_mib():.0f} MiB] {text}", file=sys.stderr, flush=True)


# -- engines ---------------------------------------------------------------------------------------------------------
@dataclass
class Engine:
    """One engine at one precision: `prepare` turns a padded batch (benchmark.py's dict of int64 tensors) into the
    engine's own input form, outside the timed region; `run` returns last_hidden_state (batch, sequence, hidden)."""

    run: Callable[[Any], torch.Tensor]
    prepare: Callable[[dict[str, torch.Tensor]], Any] = lambda inputs: inputs
    notes: list[str] = field(default_factory=list)
    describe: Callable[[], list[str]] = list  # more notes, read after the runs (kernels picked per shape)
    facts: dict[str, Any] = field(default_factory=dict)  # numbers for the JSON (optimize_for_inference's time)

    def report(self) -> list[str]:
        return self.notes + self.describe()


def torch_engine(model: torch.nn.Module, notes: list[str], facts: dict | None = None) -> Engine:
    return Engine(run=lambda inputs: model(**inputs).last_hidden_state, notes=notes, facts=facts or {})


def hfbert_engine(
    checkpoint: Path,
    quantize: str | None = None,
    precision: str = "highest",
    dtype: torch.dtype = torch.float32,
    compile: bool | str = False,
) -> Engine:
    model = hfbert.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa", dtype=dtype).eval()
    started = time.perf_counter()
    hfbert.optimize_for_inference(model, quantize=quantize, precision=precision, compile=compile)
    seconds = time.perf_counter() - started
    swapped = swapped_layers(model)
    if quantize and not any(form == quantize for form, _ in swapped):
        raise RuntimeError(f"optimize_for_inference(quantize={quantize!r}) changed no layer on this machine")
    option = (f"quantize={quantize!r}" if quantize else f"precision={precision!r}") + (
        f", compile={compile!r}" if compile else ""
    )
    weights = "" if dtype == torch.float32 else f"{str(dtype).removeprefix('torch.')} weights; "
    layers = "; ".join(swapped.values()) if swapped else "no layer swapped (the plain computation measured fastest)"
    notes = [f"{weights}optimize_for_inference({option}) took {seconds:.1f} s: {layers}", f"MKL: {mkl_branch()}"]
    facts = {"optimize_seconds": seconds, "swapped": dict(Counter(packed_layers(model).values()))}
    if not compile:  # a compiled call's first run compiles: its kernels are read by no verbose run here
        ran = {f"{batch}x{sequence}": kernels_at(model, batch, sequence) for batch, sequence in KERNEL_SHAPES}
        facts["onednn_kernels"] = ran
        notes.append("oneDNN products: " + "; ".join(f"{shape} {describe_kernels(k)}" for shape, k in ran.items()))
    engine = torch_engine(model, notes, facts)
    if compile:
        engine.prepare = lambda inputs: compile_shape(model, inputs, facts)
        engine.describe = lambda: [compiled_note(facts)]
    return engine


# The shapes at which an hfbert engine's oneDNN kernels are named (issue 53: whether AMX ran): rows 4 and 1's.
KERNEL_SHAPES = ((1, 16), (8, 128))


def kernels_at(model: torch.nn.Module, batch: int, sequence: int) -> dict[str, int]:
    """The oneDNN products one forward of `model` runs on a (batch, sequence) batch of random tokens."""
    ids = torch.randint(1000, 2000, (batch, sequence))
    with torch.inference_mode():
        return onednn_kernels(lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids)))


def hfbert_plain_engine(checkpoint: Path) -> Engine:
    """hfbert's model as from_pretrained loads it, without optimize_for_inference."""
    model = hfbert.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    return torch_engine(model, ["as loaded: sdpa attention, no optimize_for_inference", f"MKL: {mkl_branch()}"])


def compile_shape(model: torch.nn.Module, inputs: dict[str, torch.Tensor], facts: dict) -> dict[str, torch.Tensor]:
    """`inputs`, after one call that compiles their padded shape if it is new: compilation is not timed."""
    before = compile_report(model)
    with torch.no_grad():
        model(**inputs)
    for (rows, sequence, *_), seconds in compile_report(model).items() - before.items():
        facts.setdefault("compilations", []).append({"shape": [rows, sequence], "seconds": round(seconds, 1)})
    measured = facts.setdefault("measured_eager", [])
    measured += [list(key[:2]) for key in eager_shapes(model) if list(key[:2]) not in measured]
    shape = list(inputs["input_ids"].shape)
    eager = facts.setdefault("eager_shapes", [])
    if padded_shape(model, inputs["input_ids"], inputs["attention_mask"]) is None and shape not in eager:
        eager.append(shape)
    return inputs


def compiled_note(facts: dict) -> str:
    compilations = facts.get("compilations", [])
    shapes = ", ".join(f"{entry['shape'][0]}x{entry['shape'][1]} {entry['seconds']:.0f} s" for entry in compilations)
    measured = ", ".join(f"{rows}x{sequence}" for rows, sequence in facts.get("measured_eager", []))
    return (
        f"compiled {len(compilations)} shape(s) before timing ({shapes or 'none'}); "
        f"batches of {len(facts.get('eager_shapes', []))} other shape(s) ran eager (more than a quarter padding)"
        + (f"; eager measured faster than the compiled graph at {measured}, so eager ran there" if measured else "")
    )


def swapped_layers(model: torch.nn.Module) -> dict[tuple[str, str], str]:
    """What optimize_for_inference swapped, by form (`packed_layers`) and place in the layer, with the way each
    swapped module computes at each row count it was measured at (0: the plain computation; `measured.py`):
    (form, place) -> "fused attention.self x12 (at 16/128/1024 rows: way 1/1/0, 0 = plain)"."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, form in packed_layers(model).items():
        place = name.split(".", 3)[-1] if name.startswith("encoder.layer.") else name
        place = place.split(".", 2)[-1] if place.startswith("layers.") else place  # ModernBERT: layers.N.attn.Wqkv
        choice = getattr(model.get_submodule(name), "_choice", None)
        groups.setdefault((form, place), []).append("/".join(map(str, choice)) if choice else "")
    lines = {}
    for (form, place), choices in groups.items():
        counts = Counter(choice for choice in choices if choice)
        kinds = ", ".join(choice if len(counts) == 1 else f"{choice} x{count}" for choice, count in counts.items())
        rows = f" (at {'/'.join(map(str, ROW_BUCKETS))} rows: way {kinds}, 0 = plain)" if kinds else ""
        lines[form, place] = f"{form} {place} x{len(choices)}{rows}"
    return lines


def bfloat16_engine(checkpoint: Path) -> Engine:
    if not bfloat16_native():
        raise EngineUnavailableError(
            f"bf16 is emulated on this CPU ({instruction_set()}, no AVX512_BF16 or AMX): not timed"
        )
    return hfbert_engine(checkpoint, dtype=torch.bfloat16)


class EngineUnavailableError(Exception):
    """An engine that does not apply on this machine: skipped with the reason, not counted as a failure."""


def transformers_engine(checkpoint: Path) -> Engine:
    import transformers

    model = transformers.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    return torch_engine(model, ["sdpa attention", f"MKL: {mkl_branch()}"])


def transformers_default_engine(checkpoint: Path, threads: int) -> Engine:
    """transformers as users run it without hfbert: MKL's default branch (MKL_CBWR unset), where this process runs
    another (`hfbert.platform.mkl`). MKL reads its setting once per process, so this engine is a process of its own
    (`transformers_worker`), sent each batch once before the clock starts and asked to run it at each call (the
    output comes back pickled through a pipe, as part of the time: well under 1% of a call here)."""
    here = mkl_branch()
    if here.startswith(("MKL default", "no MKL")):
        raise EngineUnavailableError(f"MKL runs its default branch in this process too ({here}): not timed twice")
    environment = {name: value for name, value in os.environ.items() if name != SETTING}
    environment[SWITCH] = "off"
    command = [sys.executable, "-m", "benchmarks.peers", "--threads", str(threads), "--transformers-worker"]
    process = subprocess.Popen(
        [*command, str(checkpoint)], env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )

    def ask(*message: Any) -> Any:
        pickle.dump(message, process.stdin)
        process.stdin.flush()
        return pickle.load(process.stdout)

    notes = ["sdpa attention", f"MKL: {ask('branch')}", "in a process of its own, each output sent back through a pipe"]
    engine = Engine(run=lambda key: ask("run", key), prepare=lambda inputs: ask("keep", inputs), notes=notes)
    weakref.finalize(engine, stop_worker, process)
    return engine


def stop_worker(process: subprocess.Popen) -> None:
    process.stdin.close()
    process.wait(timeout=60)


def transformers_worker(checkpoint: Path, threads: int) -> int:
    """The process behind `transformers_default_engine`: pickled requests on stdin, pickled answers on stdout."""
    import transformers

    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr: the pipe carries answers only
    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # its stderr is the parent's: no bar amid the progress lines
    model = transformers.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    kept: list[dict[str, torch.Tensor]] = []
    with torch.no_grad():
        while True:
            try:
                kind, *arguments = pickle.load(sys.stdin.buffer)
            except EOFError:
                return 0
            if kind == "branch":
                answer: Any = mkl_branch()
            elif kind == "keep":
                kept.append(arguments[0])
                answer = len(kept) - 1
            else:
                answer = model(**kept[arguments[0]]).last_hidden_state
            pickle.dump(answer, answers)
            answers.flush()


def artifact_engine(loaded: Any, notes: list[str] = (), describe: Callable[[], list[str]] = list) -> Engine:
    """An engine of `hfbert parity --artifact` (hfbert/tools/parity/engines/): its feed built before the clock
    starts, its call timed; outputs come back as tensors over the engine's arrays."""
    return Engine(
        run=lambda prepared: loaded.run_prepared(prepared)["last_hidden_state"],
        prepare=loaded.prepare,
        notes=[*loaded.notes, *notes],
        describe=describe,
        facts={"inference_precision": loaded.precision},
    )


def openvino_engine_at(path: Path, hidden_size: int, threads: int, precision: str = "f32") -> Engine:
    """OpenVINO at the f32 precision hint, or (`precision="default"`) at its default precision, as a user who sets
    no hint gets: bf16 on CPUs with native bf16. A default that is f32 is the f32 engine again: not timed twice."""
    loaded = openvino_engine.load(path, hidden_size, threads, precision)
    progress(f"OpenVINO {'hint ' + precision if precision != 'default' else 'default'}: {loaded.notes[0]}")
    if precision == "default" and loaded.precision == "f32":
        raise EngineUnavailableError(
            "same as OpenVINO f32: default precision here is f32 (no native bf16), not timed twice"
        )
    kernels = lambda: [f"kernels (last shape run): {openvino_engine.runtime_kernels(loaded.native)}"]  # noqa: E731
    return artifact_engine(loaded, ["unfused ONNX"], kernels)


# -- artifacts: ONNX files and the CTranslate2 model, built once per run in a temporary folder --------------------


def build_artifacts(
    checkpoint: Path,
    work: Path,
    config: hfbert.BertConfig,
    skipped: dict[str, str],
    without_ctranslate2: bool,
    int8: bool = True,
) -> dict:
    """The files the non-torch engines load: ONNX (plain, fused, fused int8 unless `int8` is False) and the
    CTranslate2 model. What cannot be built is left out, and `skipped` says why."""
    import transformers

    transformers.logging.set_verbosity_error()  # its load report lists the heads the encoder leaves out
    artifacts = {"plain": attempt(skipped, "ONNX export", lambda: export_onnx(checkpoint, work / "bert.onnx"))}
    if artifacts["plain"]:
        fused = attempt(
            skipped,
            "ONNX Runtime",
            lambda: fuse_onnx(
                artifacts["plain"], work / "bert-fused.onnx", config.num_attention_heads, config.hidden_size
            ),
        )
        artifacts["fused"], artifacts["fusions"] = fused or (None, {})
    else:
        skipped["ONNX Runtime"] = skipped["OpenVINO"] = "needs the ONNX export, which failed"
    if artifacts.get("fused") and int8:
        quantized = work / "bert-fused-int8.onnx"
        artifacts["int8"] = attempt(skipped, "ONNX Runtime int8", lambda: quantize_onnx(artifacts["fused"], quantized))
    if without_ctranslate2:
        skipped["CTranslate2"] = "--without-ctranslate2"
    else:
        artifacts["ctranslate2"] = attempt(skipped, "CTranslate2", lambda: convert_ctranslate2(checkpoint, work))
    gc.collect()  # the exporter and the ONNX tools leave large graphs in reference cycles
    return {name: value for name, value in artifacts.items() if value is not None}


def build_engines(
    precision: str, checkpoint: Path, config: hfbert.BertConfig, artifacts: dict, threads: int, skipped: dict[str, str]
) -> dict[str, Engine]:
    """The engines of one precision, in table order; one that cannot be built is left out (`skipped` says why)."""
    engines: dict[str, Engine | None] = {}
    if precision == "fp32":
        engines["hfbert"] = attempt(skipped, "hfbert fp32", lambda: hfbert_engine(checkpoint))
        engines["hfbert fast"] = attempt(skipped, "hfbert fast", lambda: hfbert_engine(checkpoint, precision="high"))
        engines["hfbert compiled"] = attempt(
            skipped, "hfbert compiled fp32", lambda: hfbert_engine(checkpoint, precision="high", compile=True)
        )
        engines["transformers"] = transformers_engine(checkpoint)
        engines["transformers (MKL default)"] = attempt(
            skipped, "transformers (MKL default)", lambda: transformers_default_engine(checkpoint, threads)
        )
    if precision == "int8":
        engines["hfbert"] = attempt(skipped, "hfbert int8", lambda: hfbert_engine(checkpoint, quantize="int8"))
        engines["hfbert compiled"] = attempt(
            skipped, "hfbert compiled int8", lambda: hfbert_engine(checkpoint, quantize="int8", compile=True)
        )
        skipped["transformers int8"] = "transformers has no int8 CPU path of its own"
    if precision == "bf16":
        engines[report.HFBERT_BF16_MODE] = attempt(
            skipped, report.HFBERT_BF16_MODE, lambda: hfbert_engine(checkpoint, precision="bf16")
        )
        engines["hfbert compiled"] = attempt(
            skipped, "hfbert compiled bf16", lambda: hfbert_engine(checkpoint, precision="bf16", compile=True)
        )
        engines["hfbert bf16"] = attempt(skipped, "hfbert bf16", lambda: bfloat16_engine(checkpoint))
    if precision == "int8":
        skipped[f"{openvino_engine.NAME} int8"] = (
            "needs NNCF (weight compression or calibrated quantization), not installed; OpenVINO cannot read "
            "ORT's int8 graph (no conversion for com.microsoft.QAttention, QEmbedLayerNormalization)"
        )
    hidden = config.hidden_size
    fusions = "fused: " + ", ".join(f"{name} x{count}" for name, count in artifacts.get("fusions", {}).items())
    quantized = "quantize_dynamic of the fused graph: int8 weights per channel, uint8 activations"
    ort, ov, ct2 = onnxruntime_engine, openvino_engine, ctranslate2_engine

    def onnx(note: str) -> Callable[[Path], Engine]:
        return lambda path: artifact_engine(ort.load(path, hidden, threads), [note])

    def ctranslate2(compute_type: str) -> Callable[[Path], Engine]:
        return lambda path: artifact_engine(ct2.load(path, hidden, threads, compute_type=compute_type))

    def openvino(hint: str) -> Callable[[Path], Engine]:
        return lambda path: openvino_engine_at(path, hidden, threads, hint)

    peers = {  # (precision, column): (what `skipped` calls it, the artifact it loads, how)
        ("fp32", ort.NAME): (ort.NAME, "fused", onnx(fusions)),
        ("int8", ort.NAME): (f"{ort.NAME} int8", "int8", onnx(quantized)),
        ("fp32", ov.NAME): (ov.NAME, "plain", openvino("f32")),
        ("bf16", OPENVINO_DEFAULT): (OPENVINO_DEFAULT, "plain", openvino("default")),
        ("fp32", ct2.NAME): (f"{ct2.NAME} fp32", "ctranslate2", ctranslate2("float32")),
        ("int8", ct2.NAME): (f"{ct2.NAME} int8", "ctranslate2", ctranslate2("int8")),
    }
    for (wanted, name), (key, artifact, build) in peers.items():
        if wanted == precision and artifact in artifacts:
            engines[name] = attempt(skipped, key, functools.partial(build, artifacts[artifact]))
    return {name: engines[name] for name in ENGINES if engines.get(name) is not None}


def family_engines(
    checkpoint: Path, config: hfbert.BertConfig, artifacts: dict, threads: int, skipped: dict[str, str]
) -> dict[str, Engine]:
    """Row 6's engines: the fp32 ones, with hfbert's model as loaded and ONNX Runtime on the unfused graph too."""
    engines: dict[str, Engine | None] = dict(build_engines("fp32", checkpoint, config, artifacts, threads, skipped))
    engines[HFBERT_PLAIN] = attempt(skipped, HFBERT_PLAIN, lambda: hfbert_plain_engine(checkpoint))
    if "plain" in artifacts:
        load = lambda: onnxruntime_engine.load(artifacts["plain"], config.hidden_size, threads)  # noqa: E731
        engines[ORT_UNFUSED] = attempt(skipped, ORT_UNFUSED, lambda: artifact_engine(load(), ["unfused ONNX"]))
    return {name: engines[name] for name in ENGINES if engines.get(name) is not None}


def attempt(skipped: dict[str, str], key: str, build: Callable[[], Any]) -> Any:
    """`build()`, or None when a peer is missing or fails on this machine: reported, not fatal to the others."""
    try:
        return build()
    except EngineUnavailableError as error:
        skipped[key] = str(error)
    except ImportError as error:
        skipped[key] = f"not installed ({error.name or error}): pip install -e '.[bench]'"
    except Exception as error:
        skipped[key] = f"failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
    return None
