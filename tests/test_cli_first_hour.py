"""The `hfbert` command as a new user meets it in the first hour (issue #64): what got in the way, each fixed at its
cause and checked here.

- `fill-mask` on a checkpoint without a masked-LM head says so for every member, naming the head's tensors as the
  member's own masked-LM class names them (ModernBERT's `head` and `decoder`), which are exactly the parameters
  transformers reports missing when it loads the same folder;
- what can be checked without the model is checked before it loads (a load takes seconds): a missing or unreadable
  input file, invalid UTF-8 or JSON in it, a missing output folder, another family's `model_type` (DeBERTa's
  config.json, whose `type_vocab_size` of 0 used to be named instead);
- options and texts come in any order (`rerank M --query Q doc1 doc2`, `embed M --sparse "text"`), with the results
  sentence-transformers gives; an argument left over is the command's usage error, not `hfbert`'s;
- `--dtype` with `--precision` / `--quantize` is either meaningful (a bf16 checkpoint read as float32 for the fp32
  kernels) or one usage error that says why; `--sparse` on a bge-m3 folder points to `--output sparse`;
- `... | head` ends quietly (exit 141, nothing on stderr), and a progress log shows each count once.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hfbert.tools.progress
from hfbert.cli import build_parser, main
from hfbert.modeling.family import member
from hfbert.modeling.pretrained import BertPreTrainedModel

from support.cli import ROOT
from support.members import MODEL_TYPES, reference_checkpoint, reference_class
from support.robust import assert_one_line, copy_of, run

transformers = pytest.importorskip("transformers")


# -- fill-mask without a masked-LM head, on every member -----------------------------------------------------------


@pytest.mark.parametrize("task", ["model", "sequence-classification"])
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_fill_mask_names_the_absent_masked_lm_head_of_every_member(model_type, task, tmp_path, capsys):
    """A base-only save (gte-modernbert-base's layout) and a classifier's: ModernBERT's ended in `StopIteration`,
    because the CLI kept its own table of head names (BERT's and RoBERTa's) instead of the member's."""
    directory = reference_checkpoint(tmp_path / model_type, model_type, task)
    # transformers' own account of what the masked-LM model lacks in this folder.
    _, info = reference_class(model_type, "masked-lm").from_pretrained(directory, output_loading_info=True)
    missing = set(info["missing_keys"])
    assert missing, "transformers finds the masked-LM head in the folder"
    capsys.readouterr()  # transformers' progress bars
    code, stderr = run(capsys, "fill-mask", directory, "a [MASK] day")
    assert_one_line(code, stderr, f"hfbert fill-mask: {directory}: the checkpoint has no masked-LM head (no ")
    named = stderr.split("(no ", 1)[1].rsplit(" tensors)", 1)[0].split(" or ")
    assert all(prefix.endswith("*") for prefix in named), stderr
    prefixes = [prefix.removesuffix("*") for prefix in named]
    assert all(any(key.startswith(prefix) for key in missing) for prefix in prefixes), (prefixes, missing)
    assert all(any(key.startswith(prefix) for prefix in prefixes) for key in missing), (prefixes, missing)


# -- checked before the model loads ---------------------------------------------------------------------------------


@pytest.fixture
def no_model_load(monkeypatch):
    """Every hfbert model load recorded and refused: a check that needs no model must fail before one."""
    loads = []

    def refuse(cls, *args, **kwargs):
        loads.append(cls.__name__)
        raise RuntimeError(f"{cls.__name__} was loaded")

    monkeypatch.setattr(BertPreTrainedModel, "from_pretrained", classmethod(refuse))
    return loads


def another_family() -> dict:
    """transformers' AlbertConfig (a family hfbert does not load), with no token types (type_vocab_size 0), a field
    BERT reads differently: what used to fail first, on that field, rather than on its model_type."""
    config = transformers.AlbertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, type_vocab_size=0)
    values = config.to_dict()
    assert values["model_type"] == "albert" and values["type_vocab_size"] == 0
    return values


@pytest.fixture
def albert(tiny_mlm, tmp_path) -> Path:
    """tiny_mlm with another family's config.json (`another_family`)."""
    directory = copy_of(tiny_mlm, tmp_path / "albert")
    (directory / "config.json").write_text(json.dumps(another_family()))
    return directory


def test_bad_inputs_and_outputs_are_named_before_the_model_loads(tiny_mlm, tmp_path, capsys, no_model_load):
    missing = tmp_path / "missing.txt"
    not_utf8 = tmp_path / "texts.txt"
    not_utf8.write_bytes(b"fine\n" * 1000 + b"broken \xff here\nfine\n")
    not_json = tmp_path / "texts.jsonl"
    not_json.write_text('{"text": "a"}\n{"text": 3}\n')
    folder = tmp_path / "a-folder.npy"  # a name of the right kind, but a folder
    folder.mkdir()
    nowhere = tmp_path / "typo"
    cases = [
        (["embed", tiny_mlm, "--file", missing], f"--file {missing}: no such file"),
        (["embed", tiny_mlm, "--file", folder], f"--file {folder}: is a folder"),
        (["embed", tiny_mlm, "--file", not_utf8], f"{not_utf8}:1001: not valid UTF-8 (byte 0xff at column 8)"),
        (["embed", tiny_mlm, "--file", not_json], f'{not_json}:2: expected a JSON object with a string "text" field'),
        (["embed", tiny_mlm, "x", "--out", nowhere / "e.npy"], f"--out {nowhere / 'e.npy'}: the directory {nowhere}"),
        (["embed", tiny_mlm, "x", "--out", folder], f"--out {folder}: is a folder"),
        (["embed", tiny_mlm, "x", "--sparse", "--out", nowhere / "s.jsonl"], f"the directory {nowhere} does not"),
        (["embed", tiny_mlm, "bytes \udcff that were not UTF-8"], "text 0 is not valid Unicode: '\\udcff'"),
        (["rerank", tiny_mlm, "--query", "q", "--file", missing], f"--file {missing}: no such file"),
        (["rerank", tiny_mlm, "--query", "q", "--file", not_utf8], f"{not_utf8}:1001: not valid UTF-8"),
        (["rerank", tiny_mlm, "d", "--query", "q", "--out", nowhere / "r.jsonl"], f"the directory {nowhere} does not"),
        (["rerank", tiny_mlm, "d", "--query", "q \udcff"], "--query is not valid Unicode"),
        (["parity", tiny_mlm, "--texts", missing], f"--texts {missing}: no such file"),
        (["parity", tiny_mlm, "--texts", not_utf8], f"{not_utf8}:1001: not valid UTF-8"),
    ]
    for arguments, expected in cases:
        code, stderr = run(capsys, *arguments)
        assert_one_line(code, stderr, expected)
        assert code == 1 and not no_model_load, (arguments, stderr, no_model_load)
    assert not nowhere.exists()


def test_a_missing_input_is_named_before_a_model_is_downloaded(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a download would fail: the file must be named first
    missing = tmp_path / "missing.txt"
    for command in (["embed"], ["rerank", "--query", "q"], ["parity"]):
        option = "--texts" if command == ["parity"] else "--file"
        code, stderr = run(capsys, *command, "no-such-user/no-such-model", option, missing)
        assert_one_line(code, stderr, f"{option} {missing}: no such file")


@pytest.mark.parametrize(
    "arguments",
    [["embed", "x"], ["embed", "x", "--sparse"], ["rerank", "d", "--query", "q"], ["fill-mask", "a [MASK]"]],
)
def test_another_family_is_named_by_its_model_type_before_the_model_loads(arguments, albert, capsys, no_model_load):
    """Another family's checkpoint (DeBERTa's, before it joined) was refused with `type_vocab_size must be a positive
    integer, got 0`."""
    command, *rest = arguments
    code, stderr = run(capsys, command, albert, *rest)
    assert_one_line(code, stderr, f"{albert / 'config.json'}: field 'model_type' is 'albert'; hfbert loads 'bert'")
    assert "type_vocab_size" not in stderr and not no_model_load


def test_config_names_an_unsupported_model_type_before_its_fields():
    from hfbert.modeling.config import BertConfig, ConfigError

    with pytest.raises(ConfigError, match=r"^albert/config.json: field 'model_type' is 'albert'; hfbert loads"):
        BertConfig.from_dict(another_family(), source="albert/config.json")


# -- options and texts in any order ---------------------------------------------------------------------------------


def parsed(*arguments: str) -> dict:
    values = vars(build_parser().parse_args(list(arguments)))
    return {key: value for key, value in values.items() if key not in ("parser", "run")}


ORDERS = {
    "embed --sparse": [
        ["embed", "M", "--sparse", "a text"],  # the issue's
        ["embed", "--sparse", "M", "a text"],
        ["embed", "M", "a text", "--sparse"],
    ],
    "embed": [
        ["embed", "M", "one", "two", "--batch-size", "2", "--out", "e.npy"],
        ["embed", "M", "--batch-size", "2", "one", "two", "--out", "e.npy"],
        ["embed", "M", "one", "--out", "e.npy", "two", "--batch-size", "2"],
        ["embed", "--out", "e.npy", "--batch-size", "2", "M", "one", "two"],
    ],
    "rerank": [
        ["rerank", "M", "--query", "Q", "doc1", "doc2"],  # the issue's
        ["rerank", "M", "doc1", "doc2", "--query", "Q"],
        ["rerank", "M", "doc1", "--query", "Q", "doc2"],
        ["rerank", "--query", "Q", "M", "doc1", "doc2"],
    ],
    "rerank --top-k": [
        ["rerank", "M", "--query", "Q", "doc1", "doc2", "--top-k", "1"],
        ["rerank", "--top-k", "1", "M", "doc1", "--query", "Q", "doc2"],
    ],
    "fill-mask": [
        ["fill-mask", "M", "a [MASK] day", "--top-k", "3"],
        ["fill-mask", "M", "--top-k", "3", "a [MASK] day"],
        ["fill-mask", "--top-k", "3", "M", "a [MASK] day"],
    ],
    "parity": [["parity", "M", "--texts", "t.txt"], ["parity", "--texts", "t.txt", "M"]],
    "convert": [["convert", "S", "D", "--dtype", "float16"], ["convert", "S", "--dtype", "float16", "D"]],
}


@pytest.mark.parametrize("name", ORDERS)
def test_options_and_texts_in_any_order(name):
    first, *others = ORDERS[name]
    expected = parsed(*first)
    for arguments in others:
        assert parsed(*arguments) == expected, arguments
    assert parsed("embed", "M", "--", "-a text", "--not-an-option")["texts"] == ["-a text", "--not-an-option"]


@pytest.mark.parametrize(
    ("arguments", "command", "left"),
    [
        (["rerank", "M", "--query", "Q", "doc1", "--bogus"], "rerank", "--bogus"),
        (["fill-mask", "M", "a [MASK]", "another text"], "fill-mask", "another text"),
        (["embed", "M", "text", "--sparse", "--frobnicate", "2"], "embed", "--frobnicate 2"),
    ],
)
def test_an_argument_left_over_is_the_commands_usage_error(arguments, command, left, capsys):
    code, stderr = run(capsys, *arguments)
    assert_one_line(
        code, stderr, f"hfbert {command}: error: unrecognized arguments: {left} (see hfbert {command} --help)"
    )
    assert code == 2


def test_rerank_with_the_query_first_ranks_as_sentence_transformers(tmp_path, capsys):
    """The issue's `hfbert rerank M --query Q doc1 doc2`, against sentence-transformers' `CrossEncoder.rank`."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from support.retrieval import DOCUMENTS, QUERIES, cross_encoder_folder

    directory = cross_encoder_folder(tmp_path / "reranker")
    query, documents = QUERIES[0], DOCUMENTS[:4]
    expected = sentence_transformers.CrossEncoder(str(directory), device="cpu").rank(query, documents)
    assert main(["rerank", str(directory), "--query", query, *documents]) == 0
    ranked = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["index"] for row in ranked] == [row["corpus_id"] for row in expected]
    assert np.abs(np.array([row["score"] for row in ranked]) - [row["score"] for row in expected]).max() <= 1e-5


def test_embed_sparse_with_the_text_last_encodes_as_sentence_transformers(tmp_path, capsys):
    """The issue's `hfbert embed M --sparse "text"`, against sentence-transformers' `SparseEncoder.encode`."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from support.retrieval import DOCUMENTS, splade_folder

    directory = splade_folder(tmp_path / "splade")
    theirs = sentence_transformers.SparseEncoder(str(directory), device="cpu")
    vector = theirs.encode([DOCUMENTS[0]]).to_dense()[0]
    ids = vector.nonzero().flatten().tolist()
    expected = dict(zip(theirs.tokenizer.convert_ids_to_tokens(ids), vector[ids].tolist(), strict=True))
    assert main(["embed", str(directory), "--sparse", DOCUMENTS[0]]) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert set(record["embedding"]) == set(expected)
    assert max(abs(record["embedding"][token] - weight) for token, weight in expected.items()) <= 1e-5


# -- --dtype beside --precision / --quantize, --sparse on bge-m3 ----------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            ["--dtype", "bfloat16", "--precision", "bf16"],
            "give --dtype bfloat16 or --precision bf16, not both: --dtype",
        ),
        (["--dtype", "float16", "--precision", "high"], "--precision high runs its kernels on float32 weights"),
        (["--dtype", "bfloat16", "--quantize", "int8"], "--quantize int8 runs its kernels on float32 weights"),
    ],
)
@pytest.mark.parametrize("command", [["embed", "M", "x"], ["rerank", "M", "d", "--query", "q"]])
def test_dtype_beside_a_float32_mode_is_one_usage_error(command, options, expected, capsys):
    """They overlapped: `--dtype bfloat16 --precision bf16` loaded a bf16 model, and the bf16 mode, which runs on
    float32 weights, warned that the model "runs as before"."""
    code, stderr = run(capsys, *command, *options)
    assert_one_line(code, stderr, f"hfbert {command[0]}: error: ", expected)
    assert code == 2


def test_a_float32_mode_reads_a_bf16_checkpoint_as_float32(tiny_mlm, tmp_path, capsys, recwarn):
    """`--precision high` on a checkpoint stored in bf16 ran nothing of the mode (its kernels take float32) and said
    so in a warning; it now reads the weights as float32 and runs the mode: the embeddings are transformers' on the
    float32 copy of the same weights, and nothing warns."""
    from hfbert.inference.packed import packing_supported

    if not packing_supported(torch.float32):
        pytest.skip("the fp32 kernels do not run on this CPU")
    stored = tmp_path / "bf16"
    assert main(["convert", str(tiny_mlm), str(stored), "--dtype", "bfloat16"]) == 0
    capsys.readouterr()
    text = "A sentence to embed."
    assert main(["embed", str(stored), text, "--precision", "high", "--no-normalize", "--pooling", "cls"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and "runs as before" not in captured.err, captured.err
    ours = np.array(json.loads(captured.out)["embedding"])
    model = transformers.BertModel.from_pretrained(stored, dtype=torch.float32, add_pooling_layer=False).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(stored)
    with torch.no_grad():
        theirs = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, 0].numpy()
    assert np.abs(ours - theirs).max() <= 1e-4  # the fast mode's contract: 3x transformers' fp32 error


def test_sparse_on_a_bge_m3_folder_points_to_output_sparse(tiny_mlm, tmp_path, capsys, no_model_load):
    directory = copy_of(tiny_mlm, tmp_path / "bge-m3")
    (directory / "sparse_linear.pt").write_bytes(b"")  # read only by --output sparse
    code, stderr = run(capsys, "embed", directory, "x", "--sparse")
    assert_one_line(code, stderr, "sparse_linear.pt is bge-m3's sparse head", "use --output sparse")
    assert not no_model_load


# -- a closed pipe, and progress lines ------------------------------------------------------------------------------


class ClosedPipe(io.StringIO):
    """Standard output whose reader has gone: every write raises as a pipe's does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_ends_quietly(tiny_mlm, capsys, monkeypatch):
    """`hfbert embed ... | head` exited 1 with a broken-pipe message."""
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    code = main(["embed", str(tiny_mlm), "one", "two"])
    monkeypatch.undo()
    assert code == 141 and capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly_in_a_shell(tiny_mlm):
    """A real pipe, closed by its reader before the first line (as `head -n 0` does), in a fresh process."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hfbert", "embed", str(tiny_mlm), *["a text"] * 200],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=600) == 128 + signal.SIGPIPE and stderr == "", stderr


def test_a_progress_log_gives_each_count_once(tiny_mlm, tmp_path, capsys, monkeypatch):
    """The last line was printed twice when the last update had printed it already (parity's log, embed's)."""
    monkeypatch.setattr(hfbert.tools.progress, "LOG_INTERVAL", 0.0)
    out = tmp_path / "e.npy"
    assert main(["embed", str(tiny_mlm), "one", "two", "three", "--batch-size", "1", "--out", str(out)]) == 0
    counts = [line.split(",")[0] for line in capsys.readouterr().err.splitlines() if line.startswith("embed: ")]
    assert counts == ["embed: 1/3 text (33%)", "embed: 2/3 text (67%)", "embed: 3/3 text (100%)"]
    bar = hfbert.tools.progress.Progress(None, "rerank", "document")
    bar.update(5)
    monkeypatch.setattr(hfbert.tools.progress, "LOG_INTERVAL", 3600.0)
    bar.update(2)  # not printed: the interval has not passed, so the end says it
    bar.close()
    assert [line.split(",")[0] for line in capsys.readouterr().err.splitlines()] == [
        "rerank: 5 document",
        "rerank: 7 document",
    ]


def test_rerank_progress_counts_documents_as_they_are_scored(tmp_path, capsys, monkeypatch):
    """rerank's progress stayed at `0document` under 10,000 documents: it advanced once per chunk of 10,000."""
    pytest.importorskip("sentence_transformers")
    from support.retrieval import DOCUMENTS, cross_encoder_folder

    directory = cross_encoder_folder(tmp_path / "reranker")
    documents = tmp_path / "documents.txt"
    documents.write_text("".join(document + "\n" for document in DOCUMENTS[:5]), encoding="utf-8")
    monkeypatch.setattr(hfbert.tools.progress, "LOG_INTERVAL", 0.0)
    capsys.readouterr()
    assert main(["rerank", str(directory), "--query", "q", "--file", str(documents), "--batch-size", "2"]) == 0
    counts = [line.split(",")[0] for line in capsys.readouterr().err.splitlines() if line.startswith("rerank: ")]
    assert counts == ["rerank: 2/5 document (40%)", "rerank: 4/5 document (80%)", "rerank: 5/5 document (100%)"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_bar_keeps_the_count_and_its_unit_apart(monkeypatch):
    """tqdm writes the unit right after the count: rerank's bar read `0document`."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    bar = hfbert.tools.progress.Progress(None, "rerank", "document")
    bar.update(12)
    bar.close()
    assert "12 document" in terminal.getvalue() and "document/s" in terminal.getvalue(), terminal.getvalue()


def test_the_members_masked_lm_heads_come_from_their_classes():
    """What `absent_heads` reads: each member's masked-LM class declares its head prefixes, and they are the key
    layout's."""
    from hfbert.modeling.auto import absent_heads

    for model_type in MODEL_TYPES:
        masked_lm = member(model_type).classes["masked-lm"]
        assert masked_lm.heads and set(masked_lm.heads) <= set(masked_lm.key_layout.heads), model_type
        assert absent_heads(masked_lm, []) == ()
        assert absent_heads(masked_lm, [masked_lm.heads[-1] + "bias"]) == (masked_lm.heads[-1],)
