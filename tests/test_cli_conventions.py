"""The `hfbert` command follows the conventions of the ecosystem's CLIs, the same way on
every command: `--version`, the help with no command, `python -m hfbert`, one `--device` check, `--revision` /
`--cache-dir` / `--token` wherever a model is named, `--dtype` wherever one runs, `-` for standard input, a
missing text as a usage error (exit 2), warnings and progress as plain lines on stderr, help text for every option
and examples for every command, `--json` on every command that reports.

Where the issue is silent the behaviour is huggingface_hub's `hf` CLI's: no command prints the help on stderr and
exits 2; `--version` prints the bare version.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys

import pytest
import torch

import hfbert
import hfbert.platform.cpu
import hfbert.tools.progress
from hfbert.cli import build_parser, main

from support.helpers import minilm_directory
from support.robust import assert_one_line, run

MODEL_COMMANDS = ("download", "convert", "inspect", "parity", "embed", "fill-mask", "rerank")
RUNNING_COMMANDS = ("parity", "embed", "fill-mask", "rerank")
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"  # published in the wheel


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {name: action for action in parser._actions for name in action.option_strings}


def test_version_help_and_python_m(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == importlib.metadata.version("hfbert") == hfbert.__version__
    assert main([]) == 2  # as `hf`: the help, on stderr
    help_text = capsys.readouterr().err
    assert help_text.startswith("usage: hfbert") and all(command in help_text for command in MODEL_COMMANDS)
    result = subprocess.run([sys.executable, "-m", "hfbert", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == hfbert.__version__


def test_every_option_is_explained_and_every_command_has_examples():
    for name, parser in subcommands().items():
        for action in parser._actions:
            assert action.help, f"hfbert {name} {action.option_strings or action.dest}: no help text"
        assert parser.epilog and parser.epilog.startswith("examples:"), name
        examples = [line.strip() for line in parser.epilog.splitlines()[1:]]
        assert examples and all(f"hfbert {name} " in example for example in examples), name


def test_hub_options_device_and_dtype_wherever_they_apply():
    commands = subcommands()
    for name in MODEL_COMMANDS:
        assert {"--revision", "--cache-dir", "--token"} <= set(options(commands[name])), name
    for name in RUNNING_COMMANDS:
        found = options(commands[name])
        assert found["--device"].type.__name__ == "compute_device", name
        assert set(found["--dtype"].choices) >= {"float32", "float16", "bfloat16"}, name


@pytest.mark.parametrize("device", ["cuda:99", "bogus", "meta"])
def test_one_device_check_on_every_command(device, tiny_mlm, tmp_path, capsys):
    """parity used to accept only cpu / cuda by name ("invalid choice: 'cuda:0'"), embed checked the GPU count."""
    arguments = {"parity": [tiny_mlm], "embed": [tiny_mlm, "x"], "fill-mask": [tiny_mlm, "a [MASK]"]}
    messages = set()
    for name, rest in arguments.items():
        code, stderr = run(capsys, name, *rest, "--device", device)
        assert_one_line(code, stderr, "argument --device: ")
        assert code == 2
        messages.add(stderr.split("argument --device: ", 1)[1].split(" (see ")[0])
    assert len(messages) == 1, messages  # word for word the same check
    if device == "cuda:99":
        (message,) = messages
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        assert ("has no CUDA GPU" in message) if count == 0 else (f"has {count} CUDA GPU(s)" in message)


def test_no_text_is_a_usage_error(tiny_mlm, tmp_path, capsys):
    source = tmp_path / "t.txt"
    source.write_text("x\n")
    for arguments, expected in [
        ([], "no text to embed"),
        (["text", "--file", source], "not both"),
        (["x", "--prompt", "a", "--prompt-name", "b"], "--prompt or --prompt-name"),
    ]:
        code, stderr = run(capsys, "embed", tiny_mlm, *arguments)
        assert_one_line(code, stderr, expected)
        assert code == 2


def test_emulated_bfloat16_warning_is_one_line(tiny_mlm, capsys, monkeypatch):
    """On a CPU without native bf16 the warning is one line on stderr, not Python's path:line: Category + source."""
    monkeypatch.setattr(hfbert.platform.cpu, "bfloat16_native", lambda: False)
    monkeypatch.setattr(hfbert.platform.cpu, "_warned_about_bfloat16", False)
    assert main(["fill-mask", str(tiny_mlm), "a [MASK] day", "--dtype", "bfloat16", "--json"]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hfbert fill-mask: warning: bfloat16 on this CPU"), lines
    assert "RuntimeWarning" not in captured.err and ".py:" not in captured.err
    assert len(json.loads(captured.out)) == 5


def test_fill_mask_dtype_runs_the_model_in_that_dtype(tiny_mlm, capsys):
    """--dtype float16 scores equal transformers' BertForMaskedLM run in float16 (fill-mask had no --dtype)."""
    import transformers

    text = "a [MASK] day"
    assert main(["fill-mask", str(tiny_mlm), text, "--dtype", "float16", "--json", "--top-k", "3"]) == 0
    predictions = json.loads(capsys.readouterr().out)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(tiny_mlm)
    model = transformers.BertForMaskedLM.from_pretrained(tiny_mlm, dtype=torch.float16).eval()
    batch = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[0, batch["input_ids"][0].tolist().index(tokenizer.mask_token_id)]
    scores = logits.float().softmax(-1)
    top = scores.topk(3)
    assert [p["token"] for p in predictions] == top.indices.tolist()
    assert max(abs(p["score"] - s) for p, s in zip(predictions, top.values.tolist(), strict=True)) <= 2e-3


def test_progress_is_printed_as_lines_when_stderr_is_not_a_terminal(tiny_mlm, tmp_path, capsys, monkeypatch):
    """tqdm's default printed nothing off a terminal: CI logs showed no progress for minutes."""
    monkeypatch.setattr(hfbert.tools.progress, "LOG_INTERVAL", 0.0)
    assert (
        main(["embed", str(tiny_mlm), "one", "two", "three", "--batch-size", "1", "--out", str(tmp_path / "e.npy")])
        == 0
    )
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines if line.startswith("embed: ")][:3] == [
        "embed: 1/3 text (33%)",
        "embed: 2/3 text (67%)",
        "embed: 3/3 text (100%)",
    ]
    source = tmp_path / "texts.txt"
    source.write_text("A first sentence.\nAnother one.\n", encoding="utf-8")
    assert main(["parity", str(tiny_mlm), "--texts", str(source)]) == 0
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("parity: ")]
    assert progress and progress[-1].startswith("parity: ") and "(100%)" in progress[-1]


def test_parity_reads_its_texts_from_standard_input(tiny_mlm, hfbert_command):
    """Standard input a pipe: in-process in the default run, `python -m hfbert` in a fresh process in the slow one."""
    result = hfbert_command(
        "parity", tiny_mlm, "--texts", "-", "--json", stdin=b"A first sentence.\nAnother one.\nA third.\n"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # --json with no file: the report on stdout, the table on stderr
    assert report["passed"] and report["cases"][0] == {**report["cases"][0], "name": "single", "sequences": 3}
    assert "verdict    hfbert's RMS error" in result.stderr


def test_inspect_json_states_what_safetensors_reads(capsys):
    """`inspect --json`: the files with their published sha256 and the tensors as the safetensors library lists
    them."""
    from safetensors import safe_open

    assert main(["inspect", str(minilm_directory()), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    files = {file["name"]: file for file in facts["files"]}
    assert files["model.safetensors"]["sha256"] == MINILM_SHA256
    with safe_open(minilm_directory() / "model.safetensors", "pt") as handle:
        expected = {name: list(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118
    assert {tensor["name"]: tensor["shape"] for tensor in facts["tensors"]} == expected
    config = json.loads((minilm_directory() / "config.json").read_text())
    assert facts["config"]["hidden_size"] == config["hidden_size"] == 384
    parameters = {name: shape for name, shape in expected.items() if name != "embeddings.position_ids"}  # a buffer
    assert facts["parameters"]["total"] == sum(torch.Size(shape).numel() for shape in parameters.values())
