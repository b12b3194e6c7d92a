"""From a benchmark's JSON result to the docs: every measured table and figure in docs/ is written here.

A docs page holds each generated part between two markers, `<!-- NAME:begin -->` and `<!-- NAME:end -->`; the
text between them is rendered from the committed result `docs/results/NAME.json` and from nothing else, so a
table cannot drift from the run behind it. The benchmarks call this module:

    python -m benchmarks.numerical_contract --update-docs  # measure, write docs/results/numerical_contract.json
    python -m benchmarks.numerical_contract --render docs/results/numerical_contract.json  # render only, no run
    python -m benchmarks.report                            # re-render every committed result
    python -m benchmarks.report --check                    # exit 1 if a page differs from its committed result

Results (docs/results/), the scripts that write them and the pages (docs/) they go to:

- numerical_contract.json: `python -m benchmarks.numerical_contract`, into numerical-contract.md;
- peers.json and peers_avx2.json: `python -m benchmarks.peers [--cap-isa AVX2]`, into cpu-inference.md;
- benchmark.json and benchmark_optimized.json: `python -m benchmarks.benchmark [--optimized]`, into
  cpu-inference.md;
- certify.json: `python -m benchmarks.certify`, into certifying-a-deployment.md.

Figures (PNG, docs/images/) are drawn with matplotlib when it is installed; `--check` compares the Markdown only
(a PNG's bytes depend on the matplotlib version). This module imports neither torch nor hfbert: tests/test_docs.py
renders every committed result and compares it with the pages.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import busy

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
IMAGES = DOCS / "images"


# -- sections ----------------------------------------------------------------------------------------------------
def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def section(text: str, name: str) -> str | None:
    """The text between NAME's markers, or None when the page has no such section."""
    begin, end = markers(name)
    match = re.search(re.escape(begin) + r"\n(.*?)" + re.escape(end), text, flags=re.DOTALL)
    return match.group(1) if match else None


def replace_section(text: str, name: str, body: str, page: Path) -> str:
    begin, end = markers(name)
    if section(text, name) is None:
        raise SystemExit(f"{page}: no section {name!r}: add the lines {begin!r} and {end!r} where it goes")
    body = body.rstrip("\n") + "\n"
    pattern = re.escape(begin) + r"\n.*?" + re.escape(end)
    return re.sub(pattern, lambda _: f"{begin}\n{body}{end}", text, count=1, flags=re.DOTALL)


# -- shared ------------------------------------------------------------------------------------------------------
def generated_note(name: str, command: str) -> str:
    return (
        f"<!-- Written by `python -m benchmarks.report` from docs/results/{name}.json (measured by `{command}`); "
        "do not edit by hand. -->"
    )


def verdict(passed: bool) -> str:
    return "pass" if passed else "FAIL"


def busy_text(machine: dict) -> str:
    """How busy other processes kept the cores during the run; over `busy.BUSY_LIMIT`, that its times are skewed and
    whether it was published with --allow-busy. Empty when the run did not measure it."""
    if machine.get("others_cores") is None:
        return ""
    text = f"other processes kept {machine['others_cores']:.2f} of {machine['cores']} cores busy meanwhile"
    if busy.over_limit(machine):
        text += f", more than the {busy.BUSY_LIMIT} a published result may have: its times are skewed"
        if machine.get("busy_forced"):
            text += " (published anyway with `--allow-busy`)"
    return text


def run_line(run_time: str, machine: dict) -> str:
    """A benchmark's run time, how busy other processes kept the cores meanwhile, and the date it was measured."""
    if busy_text(machine):
        run_time += "; " + busy_text(machine)
    if machine.get("measured"):
        run_time += f"; measured {machine['measured']}"
    return run_time + "."


# -- the numerical contract ------------------------------------------------------------------------------------------
KERNEL_NAMES = {
    "standard": "F.linear (default)",
    "packed": "packed (optimize_for_inference)",
    "fast": 'fast (precision="high", bound 3x)',
}
PATHS = [("eager", "padded"), ("eager", "padding-free"), ("sdpa", "padded"), ("sdpa", "padding-free")]
CONTRACT_RATIO = 1.5  # hfbert.tools.parity.ACCURACY_RATIO: the verdict's bound


def contract_groups(result: dict) -> dict[tuple, dict]:
    """(checkpoint, dtype, kernel) -> {(attn, padding): row}, in the order the rows were measured."""
    groups: dict[tuple, dict] = {}
    for row in result["rows"]:
        groups.setdefault((row["checkpoint"], row["dtype"], row["kernel"]), {})[(row["attn"], row["padding"])] = row
    return groups


def contract_machine(results: list[dict]) -> str:
    first = results[0]
    isas = "; ".join(f"`{result['isa']}` = {result['instruction_set']}" for result in results)
    when = f" Measured {first['measured']}." if first.get("measured") else ""
    worker = max(results, key=lambda result: result.get("others_cores") or 0.0)
    if busy_text(worker):
        when += f" While the busiest worker ran, {busy_text(worker)}."
    return (
        f"CPU: {first['cpu']}. Instruction sets: {isas}. torch {first['torch']}, transformers "
        f"{first['transformers']}; {first['texts']} parity sentences, {first['tokens']} real tokens.{when}"
    )


def contract_table(results: list[dict]) -> str:
    """One line per instruction set, checkpoint, dtype and kernel: the worst ratio on each path, the verdict."""
    paths = " | ".join(f"{attn}, {padding}" for attn, padding in PATHS)
    lines = [
        f"| ISA | checkpoint | dtype | linear kernel | transformers RMS err | {paths} | verdict |",
        "|---|---|---|---|---|" + "---|" * len(PATHS) + "---|",
    ]
    for result in results:
        for (checkpoint, dtype, kernel), rows in contract_groups(result).items():
            ratios = " | ".join(f"{rows[path]['worst_ratio']:.2f}" if path in rows else "" for path in PATHS)
            theirs = max(row["transformers_rms"] for row in rows.values())
            passed = all(row["passed"] for row in rows.values())
            lines.append(
                f"| {result['isa']} | {checkpoint} | {dtype} | {KERNEL_NAMES.get(kernel, kernel)} | {theirs:.2e} "
                f"| {ratios} | {verdict(passed)} |"
            )
    return "\n".join(lines)


def sensitivity_table(results: list[dict]) -> str:
    measured = [result for result in results if result.get("sensitivity")]
    if not measured:
        return ""
    deltas = [row["delta"] for row in measured[0]["sensitivity"]]
    weight = measured[0]["sensitivity"][0]["weight"]
    lines = [
        f"Sensitivity: the bert-base layout's `{weight}` scaled by 1 + delta (sdpa, float32, default kernel); "
        "worst ratio and verdict per instruction set.",
        "",
        "| delta | " + " | ".join(result["isa"] for result in measured) + " |",
        "|---|" + "---|" * len(measured),
    ]
    for index, delta in enumerate(deltas):
        cells = []
        for result in measured:
            row = result["sensitivity"][index]
            cells.append(f"{row['worst_ratio']:.2f} {verdict(row['passed'])}")
        lines.append(f"| {delta:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def contract_markdown(results: list[dict], images: bool = True) -> str:
    parts = [contract_machine(results), ""]
    if images:
        parts += [
            "![The worst ratio of every path: hfbert's RMS error against float64 over transformers' own, one cell "
            "per instruction set, checkpoint, dtype, kernel and path; the contract allows 1.5](images/"
            "numerical_contract.png)",
            "",
        ]
    parts.append(contract_table(results))
    sensitivity = sensitivity_table(results)
    if sensitivity:
        parts += ["", sensitivity]
        if images:
            parts += [
                "",
                "![The worst ratio as one weight matrix drifts by a relative delta: caught from the first "
                "delta above the 1.5 line](images/numerical_contract_sensitivity.png)",
            ]
    return "\n".join(parts)


def contract_figures(results: list[dict], images: Path) -> None:
    plt, colors = pyplot()
    labels, values = [], []
    for result in results:
        for (checkpoint, dtype, kernel), rows in contract_groups(result).items():
            kernel_name = KERNEL_NAMES.get(kernel, kernel).split(" (")[0]
            labels.append(f"{result['isa']} | {checkpoint} | {dtype} | {kernel_name}")
            values.append([rows[path]["worst_ratio"] if path in rows else math.nan for path in PATHS])
    worst = max((value for row in values for value in row if not math.isnan(value)), default=1.0)
    norm = colors.TwoSlopeNorm(vmin=1.0, vcenter=CONTRACT_RATIO, vmax=max(2.0, worst))
    figure, axes = plt.subplots(figsize=(10.5, 1.6 + 0.36 * len(labels)), layout="constrained")
    image = axes.imshow(values, cmap="RdYlGn_r", norm=norm, aspect="auto")
    axes.set_xticks(range(len(PATHS)), [f"{attn}\n{padding}" for attn, padding in PATHS])
    axes.xaxis.tick_top()
    axes.set_yticks(range(len(labels)), labels, fontsize=9)
    axes.tick_params(length=0)
    for y, row in enumerate(values):
        for x, value in enumerate(row):
            if not math.isnan(value):
                axes.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize=9)
    for y in range(1, len(labels)):  # thin white rules between rows
        axes.axhline(y - 0.5, color="white", linewidth=1)
    bar = figure.colorbar(image, ax=axes, shrink=min(1.0, 8 / len(labels) + 0.3), pad=0.02)
    bar.ax.axhline(CONTRACT_RATIO, color="black", linewidth=2)
    bar.set_ticks(sorted({1.0, 1.25, CONTRACT_RATIO, max(2.0, worst)}))
    bar.set_label(f"ratio (limit {CONTRACT_RATIO}: black line)")
    axes.set_title(
        "hfbert's RMS error against float64 / transformers' RMS error against float64\n"
        f"(worst output of each path; {results[0]['cpu']}, {results[0]['texts']} sentences)",
        fontsize=11,
    )
    save(figure, images / "numerical_contract.png")

    measured = [result for result in results if result.get("sensitivity")]
    if not measured:
        return
    figure, axes = plt.subplots(figsize=(7, 4), layout="constrained")
    for result in measured:
        deltas = [row["delta"] for row in result["sensitivity"]]
        axes.plot(deltas, [row["worst_ratio"] for row in result["sensitivity"]], marker="o", label=result["isa"])
    axes.axhline(CONTRACT_RATIO, color="black", linestyle="--", linewidth=1.5)
    smallest = min(row["delta"] for result in measured for row in result["sensitivity"])
    axes.text(smallest, CONTRACT_RATIO * 1.08, f"contract limit {CONTRACT_RATIO}")
    axes.set_xscale("log")
    axes.set_yscale("log")
    top = max(row["worst_ratio"] for result in measured for row in result["sensitivity"])
    ticks = [tick for tick in (1, 1.5, 2, 5, 10, 20, 50, 100, 200, 500) if tick <= top * 1.5]
    axes.set_yticks(ticks, [f"{tick:g}" for tick in ticks])
    axes.minorticks_off()
    axes.set_xlabel("relative change delta of one weight matrix (layer 5 output.dense x (1 + delta))")
    axes.set_ylabel("worst ratio (hfbert / transformers error)")
    axes.set_title(f"What the verdict catches (bert-base layout, float32; {measured[0]['cpu']})", fontsize=11)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(title="instruction set")
    save(figure, images / "numerical_contract_sensitivity.png")


# -- peers ---------------------------------------------------------------------------------------------------------
# A row's ratios are against its fastest of these.
HFBERT_PLAIN, ORT_UNFUSED = "hfbert (plain)", "ONNX Runtime (unfused)"  # row 6's extra columns
HFBERT_BF16_MODE = "hfbert bf16 mode"  # optimize_for_inference(precision="bf16"); "hfbert bf16": the model cast
HFBERT_ENGINES = ("hfbert", "hfbert fast", "hfbert compiled", HFBERT_BF16_MODE, "hfbert bf16", HFBERT_PLAIN)
PEERS = (
    "transformers",
    "transformers (MKL default)",
    "ONNX Runtime",
    ORT_UNFUSED,
    "OpenVINO",
    "OpenVINO (default precision)",
    "CTranslate2",
)
ENGINES = (*HFBERT_ENGINES, *PEERS)  # the table's columns, in this order (those that ran)
# Issue 26's goals, printed, never asserted: hfbert's fastest engine over the fastest peer, per row; dense fp32
# (where every engine runs the same dense products) only has to match it.
GOAL_PEER_RATIO, GOAL_DENSE_FP32_RATIO, GOAL_FLOOR_RATIO = 1.1, 1.0, 1.33
GOAL_MPNET_RATIO = 2.0  # row 7, issue 42: hfbert embed against sentence-transformers on all-mpnet-base-v2
COLORS = {
    "transformers": "#7f7f7f",
    "transformers (MKL default)": "#c7c7c7",
    "ONNX Runtime": "#1f77b4",
    ORT_UNFUSED: "#aec7e8",
    "OpenVINO": "#9467bd",
    "OpenVINO (default precision)": "#c5b0d5",
    "CTranslate2": "#ff7f0e",
    "sentence-transformers": "#2ca02c",
}


# Issue 53's goals for the bf16 rows, against OpenVINO at its default precision (bf16 on these CPUs).
GOAL_BF16 = {"1-bf16": 1.0, "2-bf16": 1.5, "3-bf16": 1.5, "4-bf16": 0.9}


def peer_goal(row_key: str) -> float:
    """The goal for hfbert's fastest engine over the fastest peer on one row (row keys: benchmarks/peers.py)."""
    if row_key in GOAL_BF16:
        return GOAL_BF16[row_key]
    return GOAL_DENSE_FP32_RATIO if row_key == "1" else GOAL_PEER_RATIO


def row_precision(row_key: str) -> str:
    return row_key.split("-")[1] if "-" in row_key else "fp32"


def show_seconds(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.3g} ms"


def peers_machine(result: dict) -> list[str]:
    machine = result["machine"]
    isa = machine["instruction_set"]
    if machine.get("cap"):
        isa = f"{machine['cap']} (torch reports {isa})"
    lines = [
        f"Machine: {machine['cpu']}; instruction set {isa}; avx512_bf16 "
        f"{'yes' if machine['avx512_bf16'] else 'no'}; {machine['cores']} cores, {machine['threads']} threads for "
        "every engine.",
        "Versions: " + ", ".join(f"{name} {value}" for name, value in machine["versions"].items()) + ".",
    ]
    if machine.get("mkl_branch"):
        lines.append(f"MKL (torch's fp32 products: hfbert's, transformers'): {machine['mkl_branch']}.")
    if machine.get("cap"):
        variables = " ".join(f"{name}={value}" for name, value in machine["cap_variables"].items())
        lines.append(f"Cap {variables}: {machine.get('cap_reach', '')}.")
    lines.append(run_line(f"Run time {result['seconds'] / 60:.0f} min", machine))
    if result.get("args", {}).get("quick") == "True":
        if any(row["row"].split("-")[0] in ("2", "3", "6") for row in result["rows"]):
            lines.append("A `--quick` run: 64 mixed-length sequences instead of 256, fewer timed rounds.")
        else:
            lines.append("A `--quick` run: fewer timed rounds, the same inputs.")
    if result.get("partial"):
        measured = ", ".join(
            row["label"].split(".")[0] + (" int8" if "int8" in row["row"] else "") for row in result["rows"]
        )
        lines.append(f"A partial run: it stopped after rows {measured}; the other rows were not measured.")
    return lines


def peers_columns(result: dict) -> list[str]:
    """The engines that ran in some row, in ENGINES' order."""
    ran = {name for row in result["rows"] for name in row["seconds"]}
    return [name for name in ENGINES if name in ran]


def peers_outcome(row: dict) -> str:
    if "hfbert_vs_fastest_peer" not in row:
        return ""
    ratio, goal = row["hfbert_vs_fastest_peer"], row.get("goal", peer_goal(row["row"]))
    ours = f"{row['hfbert_fastest']} / " if row.get("hfbert_fastest", "hfbert") != "hfbert" else ""
    return f"{ratio:.2f}x ({ours}{row['fastest_peer']}; goal >= {goal:.2f}x) {'met' if ratio >= goal else 'MISS'}"


# Rows printed in tables of their own, after the main one (benchmarks/peers.py's result keys).
SEPARATE_ROWS = ("embed", "mpnet_embed", "rerank", "sparse", "modernbert")


def peers_table(result: dict) -> list[str]:
    if not result["rows"]:
        if any(result.get(key) for key in SEPARATE_ROWS):
            return ["The main table's rows (1 to 4, their int8 and bf16 forms, 6) were not run; those measured follow."]
        return ["No workload row ran (the skipped engines are listed below)."]
    columns = peers_columns(result)
    floors = result.get("floor", {}).get("precisions", {})
    gemm = result.get("gemm")
    lines = [
        f"| workload | {' | '.join(columns)} | hfbert's fastest vs fastest peer |",
        f"|---|{'---|' * len(columns)}---|",
    ]

    def extra(label: str, values: dict[str, str]) -> None:  # a line of numbers under a row, one per engine
        lines.append(f"| {label} | {' | '.join(values.get(name, '-') for name in columns)} | |")

    for row in result["rows"]:
        mine = row.get("hfbert_fastest", "hfbert")
        cells = []
        for name in columns:
            if name not in row["seconds"]:
                cells.append("-")
            elif name == mine or "ratio" not in row:
                cells.append(show_seconds(row["seconds"][name]))
            else:
                cells.append(f"{show_seconds(row['seconds'][name])} ({row['ratio'][name]:.2f}x)")
        lines.append(f"| {row['label']} | {' | '.join(cells)} | {peers_outcome(row)} |")
        precision = row_precision(row["row"])
        if gemm and "gflops" in row:
            extra(
                f"GFLOP/s, share of torch.mm {gemm['n']}^3 {gemm['dtype']} ({gemm['gflops']:.0f} GFLOP/s)",
                {name: f"{value:.0f} ({value / gemm['gflops']:.0%})" for name, value in row["gflops"].items()},
            )
        if row["row"].startswith("4") and precision in floors:
            floor = floors[precision]["seconds"]
            extra(
                f"x weight-streaming floor ({precision}: {show_seconds(floor)})",
                {name: f"{value / floor:.1f}x" for name, value in row["seconds"].items()},
            )
        if row.get("cosine") is not None:
            extra(row["cosine_label"], {name: f"{value:.6f}" for name, value in row["cosine"].items()})
        if row.get("accuracy") is not None:
            accuracy = row["accuracy"]
            extra(
                f"RMS err vs float64, x transformers' fp32 ({accuracy['transformers_fp32_rms_error']:.2e}), "
                f"{precision}",
                {name: f"{value['rms_ratio']:.2f}x" for name, value in accuracy["engines"].items()},
            )
    family = any("note" in row for row in result["rows"])
    lines += [
        "",
        "Cells: median time per pass over the workload's batches (per call for latency"
        + (" and batch 1" if family else "")
        + "), then engine time / hfbert's fastest engine's time in that row: above 1, hfbert is faster. Accuracy "
        "lines, over the real tokens of the dense batch and the first mixed batch: each engine's smallest cosine "
        "similarity to transformers fp32"
        + (
            f", and its RMS error against transformers' {'model' if family else 'BertModel'} run in float64 (the "
            "exact reference) as a multiple of transformers fp32's own (1.00x: as accurate as transformers)"
            if any(row.get("accuracy") for row in result["rows"])
            else ""
        )
        + ".",
    ]
    lines += [f"Row {row['row']}: {row['note']}." for row in result["rows"] if "note" in row]
    return lines


def peers_embed(result: dict) -> list[str]:
    lines = []
    embed = result.get("embed")
    if embed:
        tokens = embed["tokens"]
        met = "met" if embed["ratio"] >= GOAL_PEER_RATIO else "MISS"
        lines += [
            "",
            f"| 5. embed, all-MiniLM-L6-v2, {embed['texts']} real texts ({tokens['total']} tokens, median "
            f"{tokens['median']:.0f}, max {tokens['max']}), batches of 32, fp32 | hfbert embed "
            f"| sentence-transformers encode | hfbert vs peer (goal >= {GOAL_PEER_RATIO:.2f}x) | min cosine |",
            "|---|---|---|---|---|",
            f"| seconds | {show_seconds(embed['seconds']['hfbert'])} "
            f"| {show_seconds(embed['seconds']['sentence-transformers'])} | {embed['ratio']:.2f}x {met} "
            f"| {embed['min_cosine']:.6f} |",
        ]
    return lines + peers_mpnet(result)


def peers_mpnet(result: dict) -> list[str]:
    """Row 7: hfbert embed against sentence-transformers and ONNX Runtime on all-mpnet-base-v2 (goal, issue 42:
    2x sentence-transformers)."""
    mpnet = result.get("mpnet_embed")
    if not mpnet:
        return []
    tokens, peers = mpnet["tokens"], list(mpnet["ratios"])
    met = "met" if mpnet["ratio"] >= GOAL_MPNET_RATIO else "MISS"
    return [
        "",
        f"| 7. embed, all-mpnet-base-v2, {mpnet['texts']} real texts ({tokens['total']} tokens, median "
        f"{tokens['median']:.0f}, max {tokens['max']}), batches of 32, fp32 | hfbert embed | "
        + " | ".join(peers)
        + " |",
        "|---|---|" + "---|" * len(peers),
        f"| seconds | {show_seconds(mpnet['seconds']['hfbert'])} | "
        + " | ".join(show_seconds(mpnet["seconds"][name]) for name in peers)
        + " |",
        "| peer / hfbert | 1.00x | "
        + " | ".join(
            f"{mpnet['ratios'][name]:.2f}x" + (f" {met} (goal >= {GOAL_MPNET_RATIO:.1f}x)" if name == peers[0] else "")
            for name in peers
        )
        + " |",
        "| vs sentence-transformers: min cosine / max abs | "
        + " | ".join(
            f"{mpnet['accuracy'][name]['min_cosine']:.6f} / {mpnet['accuracy'][name]['max_abs']:.1e}"
            for name in ("hfbert", *peers)
        )
        + " |",
    ]


def measured(entry: dict, lossy: bool = True) -> str:
    """A lossy engine's (or another engine's) distance to sentence-transformers on row 8 or 9, as recorded."""
    spread = f"relative RMS {entry['relative_rms']:.3f}, " if "relative_rms" in entry else ""
    zeros = f", {entry['nonzero_differ']} entries differ in zeros" if "nonzero_differ" in entry else ""
    return f"{spread}max abs {entry['max_abs']:.1e}{zeros}" + (" (lossy)" if lossy else "")


def peers_retrieval(result: dict) -> list[str]:
    """Rows 8 and 9 (issue 52), in row 7's form, a column per engine: hfbert fp32 and int8, hfbert bf16 (where the
    CPU computes bf16 natively), ONNX Runtime on the head's fused graph (where it was built), sentence-transformers;
    each one's seconds, sentence-transformers' time over it against the goal, and the checks made before timing
    (fp32 within the row's tolerance of sentence-transformers; int8 and bf16 measured, lossy by design; ONNX Runtime
    measured)."""
    lines = []
    for name in ("rerank", "sparse"):
        row = result.get(name)
        if not row:
            continue
        tokens, accuracy, seconds = row["tokens"], row["accuracy"], row["seconds"]
        if name == "rerank":
            job = f"8. rerank, {row['model']}, 1 query x {row['documents']} real texts"
            check = f"scores max abs {accuracy['max_abs']:.1e}, same order: {accuracy['order_agrees']}"
            calls = "CrossEncoder.rank"
        else:
            job = f"9. SPLADE encode, {row['model']}, {row['texts']} real texts"
            check = f"weights max abs {accuracy['max_abs']:.1e}, {accuracy['nonzero_differ']} entries differ in zeros"
            calls = "SparseEncoder.encode"

        fp32 = f"{check} (<= {row['tolerance']:.0e}): {'agree' if accuracy['agree'] else 'MISMATCH'}"
        columns = [("hfbert", f"hfbert {calls} fp32", fp32), ("hfbert int8", "hfbert int8", measured(accuracy["int8"]))]
        if "hfbert bf16" in seconds:
            columns.append(("hfbert bf16", "hfbert bf16 (precision='bf16')", measured(accuracy["bf16"])))
        if "ONNX Runtime" in seconds:
            columns.append(("ONNX Runtime", "ONNX Runtime (head graph, fused)", measured(accuracy["onnx"], False)))
        columns.append(("sentence-transformers", f"sentence-transformers {calls} fp32", "-"))
        ratios = []
        for key, _, _ in columns:
            value = seconds["sentence-transformers"] / seconds[key]
            verdict = (" met" if value >= row["goal"] else " MISS") if key.startswith("hfbert") else ""
            ratios.append(f"{value:.2f}x{verdict}")
        lines += [
            "",
            f"| {job} ({tokens['total']} tokens, median {tokens['median']:.0f}, max {tokens['max']}), batches of 32 | "
            + " | ".join(header for _, header, _ in columns)
            + " |",
            "|---|" + "---|" * len(columns),
            "| seconds | " + " | ".join(show_seconds(seconds[key]) for key, _, _ in columns) + " |",
            f"| sentence-transformers / engine (hfbert's goal >= {row['goal']:.1f}x) | " + " | ".join(ratios) + " |",
            "| vs sentence-transformers | " + " | ".join(text for _, _, text in columns) + " |",
        ]
        if row.get("skipped"):
            lines += [f"- skipped row {row['row']} {key}: {why}" for key, why in row["skipped"].items()]
    return lines


def peers_modernbert(result: dict) -> list[str]:
    """Row 10 (issue 51): ModernBERT-base's shape on long documents, one line per workload: each engine's median
    seconds per pass and its speed-up over transformers (transformers' time / the engine's), hfbert's faster engine
    against the goal, then each engine's accuracy on the workload's checked batch."""
    row = result.get("modernbert")
    if not row:
        return []
    built = set(row.get("engines", ())) | {name for entry in row["workloads"] for name in entry["seconds"]}
    columns = [name for name in ENGINES if name in built]  # an engine built but not run on a workload shows "-"
    lines = [
        "",
        f"| {row['label']} | {' | '.join(columns)} | hfbert vs transformers |",
        f"|---|{'---|' * len(columns)}---|",
    ]
    for entry in row["workloads"]:
        seconds, speedup = entry["seconds"], entry.get("speedup", {})
        cells = [
            "-"
            if name not in seconds
            else show_seconds(seconds[name]) + (f" ({speedup[name]:.2f}x)" if name in speedup else "")
            for name in columns
        ]
        outcome = ""
        if "hfbert_vs_transformers" in entry:
            ratio, goal = entry["hfbert_vs_transformers"], entry["goal"]
            outcome = (
                f"{ratio:.2f}x ({entry['hfbert_fastest']}; goal >= {goal:.1f}x) {'met' if ratio >= goal else 'MISS'}"
            )
        tokens = entry["tokens"]
        size = (
            f"{tokens['real']:,} tokens"
            if tokens["real"] == tokens["padded"]
            else f"{tokens['real']:,} real of {tokens['padded']:,} padded tokens"
        )
        lines.append(f"| {entry['label']} ({size}) | {' | '.join(cells)} | {outcome} |")
        accuracy = entry.get("accuracy")
        if accuracy:
            shapes = ", ".join(f"{rows} x {length:,}" for rows, length in entry["checked"])
            engines = accuracy["engines"]
            lines.append(
                f"| min cosine vs transformers fp32 ({shapes}) | "
                + " | ".join(f"{engines[name]['min_cosine']:.6f}" if name in engines else "-" for name in columns)
                + " | |"
            )
            lines.append(
                f"| RMS err vs float64, x transformers' fp32 ({accuracy['transformers_fp32_rms_error']:.2e}) | "
                + " | ".join(f"{engines[name]['rms_ratio']:.2f}x" if name in engines else "-" for name in columns)
                + " | |"
            )
    return lines + [
        "",
        "Cells: median seconds per pass over the workload's batches, then transformers' time / the engine's (above "
        "1, faster than transformers); '-': not run, the reason below. Accuracy lines, over the real tokens of the "
        "batch named: each engine's smallest cosine similarity to transformers fp32, and its RMS error against "
        "transformers' model run in float64 (the exact reference) as a multiple of transformers fp32's own.",
        f"Row 10: {row['note']}.",
    ]


def peers_floor(result: dict) -> list[str]:
    floor = result.get("floor")
    if not floor:
        return []
    lines = [
        "",
        f"Read bandwidth: {floor['bandwidth'] / 1e9:.1f} GB/s (sum of 1 GiB float32, best of 5, "
        f"{result['machine']['threads']} threads).",
    ]
    for precision, entry in floor["precisions"].items():
        line = (
            f"Batch-1 floor {precision}: {entry['bytes'] / 1e6:.0f} MB of encoder Linear weights / bandwidth = "
            f"{show_seconds(entry['seconds'])}"
        )
        if "hfbert" in entry:
            name = entry.get("hfbert_engine", "hfbert")
            line += f"; {name} 1x16 latency {show_seconds(entry['hfbert'])} = {entry['ratio']:.2f}x the floor"
            if precision == "fp32":
                met = "met" if entry["ratio"] <= GOAL_FLOOR_RATIO else "MISS"
                line += f" (goal <= {GOAL_FLOOR_RATIO}x: {met})"
        lines.append(line + ".")
    return lines


def peers_engines(result: dict) -> list[str]:
    lines = []
    for precision, notes in result.get("engines", {}).items():
        for name, entries in notes.items():
            label = name if name.endswith(precision) or precision == "bf16" else f"{name} {precision}"
            lines.append(f"- {label}: {'; '.join(entries)}")
    for name, why in result.get("skipped", {}).items():
        lines.append(f"- skipped {name}: {why}")
    return lines


def modernbert_only(result: dict) -> bool:
    """A peers result of row 10 alone (`--rows modernbert`): it has a page section of its own, so that the long
    documents can be measured without rerunning rows 1 to 9 (or replacing their result)."""
    return bool(result.get("modernbert")) and not result.get("rows") and not result.get("embed")


def peers_markdown(result: dict, name: str = "peers", images: bool = True) -> str:
    lines = peers_machine(result)
    if images and not modernbert_only(result):  # row 10's speed-ups are over transformers: not in the figure
        alt = "hfbert's speed-up over each engine, per workload (engine time / hfbert's fastest engine's time)"
        lines += ["", f"![{alt}](images/{name}.png)"]
    lines += ["", *peers_table(result), *peers_embed(result), *peers_retrieval(result), *peers_modernbert(result)]
    lines += peers_floor(result)
    engines = peers_engines(result)
    if engines:
        lines += ["", "What each engine ran:", "", *engines]
    return "\n".join(lines)


def peers_figure(result: dict, path: Path) -> None:
    plt, _ = pyplot()
    groups = []  # (workload label, {engine: engine time / hfbert's fastest engine's time})
    for row in result["rows"]:
        if "ratio" in row:
            groups.append((row["label"], {name: row["ratio"][name] for name in PEERS if name in row["ratio"]}))
    if result.get("embed"):
        embed = result["embed"]
        label = f"5. embed, all-MiniLM-L6-v2, {embed['texts']} texts"
        groups.append((label, {"sentence-transformers": embed["ratio"]}))
    if result.get("mpnet_embed"):
        mpnet = result["mpnet_embed"]
        groups.append((f"7. embed, all-mpnet-base-v2, {mpnet['texts']} texts", dict(mpnet["ratios"])))
    engines = [name for name in (*PEERS, "sentence-transformers") if any(name in ratios for _, ratios in groups)]
    if not engines:
        return  # no row with a peer to compare with: no figure
    height = 0.8 / max(1, max(len(ratios) for _, ratios in groups))
    figure, axes = plt.subplots(figsize=(10, 1.0 + 0.62 * len(groups) + 0.35 * len(engines)), layout="constrained")
    values = [value for _, ratios in groups for value in ratios.values()]
    for y, (_, ratios) in enumerate(groups):
        present = [name for name in engines if name in ratios]
        for index, name in enumerate(present):  # bars from the 1x line: right, hfbert is faster; left, slower
            position = y - height * len(present) / 2 + height * (index + 0.5)
            ratio = ratios[name]
            axes.barh(position, ratio - 1, left=1, height=height * 0.9, color=COLORS[name], label=name)
            axes.text(
                ratio * (1.03 if ratio >= 1 else 0.97),
                position,
                f"{ratio:.2f}x",
                va="center",
                ha="left" if ratio >= 1 else "right",
                fontsize=8,
            )
    handles, labels = axes.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=False))
    axes.axvline(1.0, color="black", linewidth=1.5)
    axes.axvline(GOAL_PEER_RATIO, color="black", linewidth=1, linestyle=":")
    axes.set_xscale("log")
    low, high = min(values + [1.0]) / 1.5, max(values + [1.0]) * 1.5
    axes.set_xlim(low, high)
    ticks = [
        tick for tick in (0.05, 0.1, 0.2, 0.33, 0.5, 0.67, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0) if low <= tick <= high
    ]
    axes.set_xticks(ticks, [f"{tick:g}x" for tick in ticks])
    axes.minorticks_off()
    one = math.log(1 / low) / math.log(high / low)  # where the 1x line is, as a fraction of the axis
    style = {"transform": axes.transAxes, "va": "bottom", "fontsize": 9, "color": "dimgray"}
    axes.text(one - 0.01, 1.005, "<- the engine is faster", ha="right", **style)
    axes.text(one + 0.01, 1.005, "hfbert is faster ->", ha="left", **style)
    axes.set_yticks(range(len(groups)), [label for label, _ in groups])
    axes.invert_yaxis()
    axes.grid(True, axis="x", alpha=0.3)
    axes.set_xlabel(
        "engine time / hfbert's fastest time (right of the 1x line: hfbert is faster; dotted: the 1.1x goal)"
    )
    machine = result["machine"]
    isa = machine["cap"] or machine["instruction_set"]
    title = f"hfbert against the engines, bert-base ({machine['cpu']}, {isa}, {machine['threads']} threads)"
    if busy_text(machine):
        title += "\n" + busy_text(machine).replace("meanwhile", "during the run")
    axes.set_title(title, pad=18)
    figure.legend([unique[name] for name in engines], engines, loc="outside lower center", ncol=len(engines))
    save(figure, path)


# -- benchmark.py: hfbert against transformers alone -----------------------------------------------------------------
def show_value(value: float, unit: str) -> str:
    if unit == "cos":
        return f"{value:.6f}"
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


def benchmark_markdown(report: dict) -> str:
    machine, rows = report["machine"], report["rows"]
    gpu = f" ({machine['gpu']})" if "gpu" in machine else ""
    lines = [
        f"Machine: {machine['cpu']} ({machine['instruction_set']}; {'with' if machine['avx512_bf16'] else 'no'} "
        f"AVX-512 bf16), {machine['cores']} cores, {machine['device']}{gpu}; torch {machine['torch']} "
        f"({machine['threads']} threads), transformers {machine['transformers']}, Python {machine['python']}; "
        f"hfbert's linear layers: {machine['hfbert_linear']}.",
    ]
    if machine.get("mkl_branch"):
        lines.append(f"MKL (torch's fp32 products: hfbert's, transformers'): {machine['mkl_branch']}.")
    lines.append(run_line(f"Run time {report['seconds']:.0f} s", machine))
    if report.get("args", {}).get("quick") in (True, "True"):
        lines.append("A `--quick` run: 64 mixed-length sequences instead of 256, 3 timed passes instead of 10.")
    if machine.get("skipped"):
        lines.append(f"Left out: {machine['skipped']}.")
    lines += ["", "| row | hfbert | transformers | ratio | target | |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['row']} | {show_value(r['hfbert'], r['unit'])} | {show_value(r['transformers'], r['unit'])} "
            f"| {r['ratio']:.2f}x | {r['target']} | {'PASS' if r['pass'] else 'MISS'} |"
        )
    lines += ["", "ratio = hfbert / transformers of the shown quantity. Useful FLOPs count real tokens only.", ""]
    for r in rows:
        if "gemm_gflops" in r:
            lines.append(
                f"- {r['row']}: GEMM 2048^3 {r['gemm_gflops']:.0f} GFLOP/s; useful GFLOP/s hfbert "
                f"{r['useful_gflops']['hfbert']:.0f}, transformers {r['useful_gflops']['transformers']:.0f}"
            )
        if "padded_tokens" in r:
            lines.append(
                f"- {r['row']}: {r['real_tokens']} real of {r['padded_tokens']} padded tokens "
                f"({r['real_tokens'] / r['padded_tokens']:.0%}), {r['useful_gflop']:.0f} useful GFLOP per pass"
            )
    return "\n".join(lines)


# -- certifying a deployment (benchmarks/certify.py) ---------------------------------------------------------------
def show_ratio(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return str(value)
    return f"{value:.2f}x" if value < 100 else f"{value:,.0f}x"


def show_cosine(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


def certify_markdown(result: dict, images: bool = True) -> str:
    """The worked example: per artifact, how it was built, what ran, its worst ratio against float64 (bound),
    verdict, sentence-embedding cosines and retrieval agreement, median time per batch, and the likely causes."""
    machine = result["machine"]
    versions = ", ".join(f"{name} {value}" for name, value in machine["versions"].items())
    baseline = result.get("transformers_sentence_embeddings") or {}
    lines = [
        f"Measured on {machine['cpu']} ({machine['instruction_set']}), {machine['threads']} threads, "
        f"{result['model']}; {versions}.",
        run_line(f"The run (building the artifacts included) took {result['seconds']:.0f} s", machine),
        "",
        f"hfbert itself: {verdict(result['hfbert']['passed'])} "
        f"(worst ratio {show_ratio(result['hfbert']['worst_ratio'])}). "
        f"Sentence embeddings: {result['sentence_pipeline']}; transformers fp32 itself: min cos "
        f"{show_cosine(baseline.get('min_cosine'))} to float64.",
        "",
        "| artifact | engine, precision that ran | worst ratio (bound) | verdict | min cos | mean cos | top-5 "
        "agreement | median / batch |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for entry in result["artifacts"]:
        agreement = entry.get("retrieval_agreement")
        lines.append(
            f"| {entry['path']} | {entry['engine']} {entry['version']}, {entry['precision']} | "
            f"{show_ratio(entry['worst_ratio'])} ({entry['bound']:g}x) | {verdict(entry['verdict'] == 'pass')} | "
            f"{show_cosine(entry.get('min_cosine'))} | {show_cosine(entry.get('mean_cosine'))} | "
            f"{'-' if agreement is None else f'{100 * agreement:.1f}%'} | "
            f"{1000 * entry['median_seconds_per_batch']:.1f} ms |"
        )
    lines += ["", "How each was built, and the likely cause printed under a failing one:", ""]
    for entry in result["artifacts"]:
        causes = "; ".join(entry.get("likely_causes") or []) or "none printed"
        lines.append(f"- **{entry['path']}**: {entry['built']}. Likely cause: {causes}.")
    return "\n".join(lines)


# -- targets: which result goes where --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """One benchmark's result: its page, its rendering and the options of the command that measures it again.
    `variants`: (suffix, option, applies) of other results, told apart by what they record (the first that applies);
    such a result's stem is KIND_SUFFIX."""

    page: str  # relative to docs/
    markdown: Callable[[Any, str, bool], str]  # (result, name, images) -> the section's text
    figure: Callable[[Any, Path], None] | None = None
    options: str = ""
    variants: tuple[tuple[str, str, Callable[[Any], bool]], ...] = ()


TARGETS = {
    "numerical_contract": Kind(
        "numerical-contract.md",
        lambda result, _, images: contract_markdown(result, images),
        lambda result, _: contract_figures(result, IMAGES),
        options="--sensitivity",
    ),
    "peers": Kind(
        "cpu-inference.md",
        peers_markdown,
        peers_figure,
        variants=(
            ("avx2", "--cap-isa AVX2", lambda result: bool(result["machine"].get("cap"))),
            ("modernbert", "--rows modernbert", lambda result: modernbert_only(result)),
        ),
    ),
    "benchmark": Kind(
        "cpu-inference.md",
        lambda result, _, images: benchmark_markdown(result),
        variants=(
            ("optimized", "--optimized", lambda result: result.get("args", {}).get("optimized") in (True, "True")),
        ),
    ),
    "certify": Kind("certifying-a-deployment.md", lambda result, _, images: certify_markdown(result, images)),
}


@dataclass(frozen=True)
class Target:
    name: str  # the result's file stem, the page's section name and the figure's stem
    page: str
    command: str  # how to measure it again
    markdown: Callable[[Any, bool], str]
    figure: Callable[[Any, Path], None] | None


def target(kind: str, result: Any) -> Target:
    if kind not in TARGETS:
        raise ValueError(f"unknown benchmark {kind!r}: {', '.join(TARGETS)}")
    entry = TARGETS[kind]
    suffix, option = next(((suffix, option) for suffix, option, applies in entry.variants if applies(result)), ("", ""))
    name = f"{kind}_{suffix}" if suffix else kind
    command = " ".join(
        part for part in (f"python -m benchmarks.{kind}", entry.options, option, "--update-docs") if part
    )
    return Target(name, entry.page, command, lambda r, images: entry.markdown(r, name, images), entry.figure)


def kind_of(path: Path) -> str:
    for kind in TARGETS:
        if path.stem == kind or path.stem.startswith(kind + "_"):
            return kind
    raise SystemExit(f"{path}: not a result of {', '.join(TARGETS)}")


def section_text(kind: str, result: Any, figures: bool) -> tuple[Target, str]:
    chosen = target(kind, result)
    return chosen, generated_note(chosen.name, chosen.command) + "\n" + chosen.markdown(result, figures)


def render(kind: str, result: Any, figures: bool = True) -> Path:
    """Rewrite the result's section of its page (and its figure, when matplotlib is there); returns the page."""
    chosen, body = section_text(kind, result, figures)
    page = DOCS / chosen.page
    page.write_text(replace_section(page.read_text(), chosen.name, body, page))
    if figures and chosen.figure is not None:
        try:
            chosen.figure(result, IMAGES / f"{chosen.name}.png")
        except ImportError:
            print("matplotlib is not installed: figures left as they were (pip install matplotlib)", file=sys.stderr)
    print(f"rendered docs/results/{chosen.name}.json into {page.relative_to(ROOT)}", file=sys.stderr)
    return page


def machine_records(result: Any) -> list[dict]:
    """The records of the machine a result was measured on: one per worker for the numerical contract."""
    return result if isinstance(result, list) else [result["machine"]]


def publish(kind: str, result: Any, allow_busy: bool = False) -> Path:
    """After a run: write the result to docs/results/NAME.json and render it. Refused (SystemExit, nothing written)
    when other processes kept the cores too busy, unless `allow_busy` (benchmarks/busy.py)."""
    busy.settle(machine_records(result), allow_busy)
    chosen = target(kind, result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{chosen.name}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return render(kind, result)


def render_file(kind: str, path: Path, allow_busy: bool = False) -> Path:
    """`--render JSON`: render an existing result; one from elsewhere is first published to docs/results/NAME.json
    (under the same busy rule as `publish`), so that the pages always come from the committed results."""
    result = json.loads(path.read_text())
    destination = RESULTS / f"{target(kind, result).name}.json"
    if path.resolve() != destination.resolve():
        return publish(kind, result, allow_busy)
    return render(kind, result)


def differences() -> list[str]:
    """Each committed result whose page section is missing or differs from what it renders to now."""
    found = []
    for path in sorted(RESULTS.glob("*.json")):
        kind = kind_of(path)
        chosen, body = section_text(kind, json.loads(path.read_text()), figures=True)
        page = DOCS / chosen.page
        current = section(page.read_text(), chosen.name) if page.exists() else None
        if current is None:
            found.append(f"docs/{chosen.page} has no section {chosen.name!r} for docs/results/{path.name}")
        elif current.rstrip("\n") != body.rstrip("\n"):
            found.append(f"docs/{chosen.page} section {chosen.name!r} differs from docs/results/{path.name}")
    return found


# -- figures ---------------------------------------------------------------------------------------------------------
def pyplot() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.colors
    import matplotlib.pyplot

    return matplotlib.pyplot, matplotlib.colors


def save(figure: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, metadata={"Software": None})
    import matplotlib.pyplot

    matplotlib.pyplot.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description="Render every committed result in docs/results/ into docs/.")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is out of date")
    args = parser.parse_args()
    if args.check:
        found = differences()
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("re-render with: python -m benchmarks.report", file=sys.stderr)
        return 1 if found else 0
    for path in sorted(RESULTS.glob("*.json")):
        render(kind_of(path), json.loads(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
