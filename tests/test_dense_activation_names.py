"""A Dense module's config names its activation by a dotted path ("torch.nn.modules.activation.Tanh").
sentence-transformers imports any "torch.*" path it is given; hfbert looks the name up in a fixed table of torch.nn's
activation classes, so a name that is not one is refused from the name alone and nothing is imported (an import
by name runs module code: `torch.utils.model_dump.__main__` runs a command-line tool, `this` prints to stdout).

The table is judged against sentence-transformers: each name in it is the class sentence-transformers' own
`import_from_string` gives, and a checkpoint naming its activation by the public path embeds as
sentence-transformers embeds it, element-wise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from support.helpers import with_minilm_tokenizer, write_random_transformers_checkpoint

TEXTS = ["", "A short one.", "A longer sentence, about something else entirely [MASK]."]

# Each with the module its import would run (None: imported with torch already, refused all the same).
REFUSED = {
    "torch.utils.collect_env.Tanh": None,  # torch 2.x imports torch.utils.collect_env itself
    "os.system": None,
    "subprocess.Popen": None,
    "torch.utils.model_dump.__main__.Tanh": "torch.utils.model_dump",  # its import runs model_dump's command line
    "this.Tanh": "this",
    "http.server.SimpleHTTPRequestHandler": "http.server",
}

# In a fresh interpreter: the modules read_pipeline imports while it reads the checkpoint, as JSON, with its error.
RESOLVE = """
import json, sys
from pathlib import Path
from hfbert.tools.sentence_transformers_pipeline import read_pipeline

directory, target = Path(sys.argv[1]), sys.argv[2]
assert target == "-" or target not in sys.modules, f"{target} is imported before the test begins"
before = set(sys.modules)
try:
    read_pipeline(directory, 32, 512, 512)
    error = None
except ValueError as caught:
    error = str(caught)
print(json.dumps({"error": error, "imported": sorted(set(sys.modules) - before)}))
"""


@pytest.fixture(scope="module")
def dense_checkpoint(tmp_path_factory) -> Path:
    """A sentence-transformers checkpoint saved by sentence-transformers: a 1-layer BERT of hidden size 32 with
    MiniLM's tokenizer, mean pooling, Dense(32 -> 16, Tanh)."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    root = tmp_path_factory.mktemp("dense")
    shape = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    backbone = write_random_transformers_checkpoint(root / "bert", **shape)
    with_minilm_tokenizer(backbone)
    torch.manual_seed(1)
    modules = [Transformer(str(backbone)), Pooling(32, pooling_mode="mean"), Dense(32, 16)]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(root / "st"))
    return root / "st"


def naming(checkpoint: Path, directory: Path, activation: str) -> Path:
    """A copy of `checkpoint` whose Dense config names `activation`."""
    shutil.copytree(checkpoint, directory)
    config_file = next(directory.glob("*_Dense")) / "config.json"
    config = json.loads(config_file.read_text())
    assert config["activation_function"] == "torch.nn.modules.activation.Tanh"  # what sentence-transformers writes
    config_file.write_text(json.dumps({**config, "activation_function": activation}))
    return directory


def resolve_in_a_fresh_interpreter(directory: Path, target: str | None) -> tuple[dict, str]:
    tests = Path(__file__).resolve().parent
    result = subprocess.run(
        [sys.executable, "-c", RESOLVE, str(directory), target or "-"],
        capture_output=True,
        text=True,
        cwd=tests.parent,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    *printed, last = result.stdout.splitlines()
    return json.loads(last), "\n".join(printed)


# All the names in one fresh interpreter, one after the other, each attempt's output captured: the default run's
# twin of the test below, which gives each name an interpreter of its own (slow: one start each).
RESOLVE_ALL = """
import contextlib, io, json, sys
from pathlib import Path
from hfbert.tools.sentence_transformers_pipeline import read_pipeline

for directory, target in zip(sys.argv[1::2], sys.argv[2::2]):
    assert target == "-" or target not in sys.modules, f"{target} is imported before its attempt"
    before, printed = set(sys.modules), io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            read_pipeline(Path(directory), 32, 512, 512)
        error = None
    except ValueError as caught:
        error = str(caught)
    imported = sorted(set(sys.modules) - before)
    print(json.dumps({"error": error, "imported": imported, "printed": printed.getvalue()}))
"""


@pytest.fixture(scope="module")
def resolved_together(dense_checkpoint, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """name -> (its checkpoint, what read_pipeline did with it), every name of REFUSED in one fresh interpreter."""
    root = tmp_path_factory.mktemp("refused")
    directories = {name: naming(dense_checkpoint, root / str(index), name) for index, name in enumerate(REFUSED)}
    arguments = [str(part) for name in REFUSED for part in (directories[name], REFUSED[name] or "-")]
    tests = Path(__file__).resolve().parent
    result = subprocess.run(
        [sys.executable, "-c", RESOLVE_ALL, *arguments], capture_output=True, text=True, cwd=tests.parent, timeout=120
    )
    assert result.returncode == 0, result.stderr
    outcomes = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(outcomes) == len(REFUSED), result.stdout
    return {name: (directories[name], outcome) for name, outcome in zip(REFUSED, outcomes, strict=True)}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_name_outside_the_table_is_refused_and_nothing_is_imported_in_one_interpreter(resolved_together, name):
    directory, outcome = resolved_together[name]
    config_file = next(directory.glob("*_Dense")) / "config.json"
    assert outcome["error"].startswith(f"{config_file}: activation_function {name!r} is not one hfbert runs")
    assert outcome["imported"] == []  # refused from the name: no module imported, none of its code run
    assert outcome["printed"] == ""  # `this` prints the Zen of Python when imported


@pytest.mark.slow  # a fresh interpreter for each name; all in one: the test above
@pytest.mark.parametrize("name", list(REFUSED))
def test_a_name_outside_the_table_is_refused_and_nothing_is_imported(dense_checkpoint, tmp_path, name):
    directory = naming(dense_checkpoint, tmp_path / "st", name)
    outcome, printed = resolve_in_a_fresh_interpreter(directory, REFUSED[name])
    config_file = next(directory.glob("*_Dense")) / "config.json"
    assert outcome["error"].startswith(f"{config_file}: activation_function {name!r} is not one hfbert runs")
    assert outcome["imported"] == []  # refused from the name: no module imported, none of its code run
    assert printed == ""  # `this` prints the Zen of Python when imported


def test_every_name_in_the_table_is_the_class_sentence_transformers_imports():
    from sentence_transformers.util import import_from_string

    from hfbert.tools.sentence_transformers_pipeline import ACTIVATIONS

    for name in ("torch.nn.modules.activation.Tanh", "torch.nn.Tanh", "torch.nn.Identity", "torch.nn.modules.Tanh"):
        assert name in ACTIVATIONS
    assert "torch.nn.modules.linear.Identity" in ACTIVATIONS  # how sentence-transformers saves Identity
    for name, cls in ACTIVATIONS.items():
        assert import_from_string(name) is cls, name


@pytest.mark.parametrize("name", ["torch.nn.Tanh", "torch.nn.Identity", "torch.nn.modules.GELU"])
def test_a_public_activation_name_embeds_as_sentence_transformers_embeds(dense_checkpoint, tmp_path, name):
    from sentence_transformers import SentenceTransformer

    from hfbert.tools.embedding import Embedder

    directory = naming(dense_checkpoint, tmp_path / "st", name)
    reference = SentenceTransformer(str(directory), device="cpu")
    assert type(reference[2].activation_function).__name__ == name.rsplit(".", 1)[1]
    expected = reference.encode(TEXTS, convert_to_numpy=True)
    ours = Embedder(directory).embed(TEXTS).numpy()
    assert ours.shape == expected.shape == (len(TEXTS), 16)
    assert np.abs(ours - expected).max() <= 1e-5
