"""Parity with transformers: run a checkpoint in hfbert and in `transformers` side by side, output by output.

    >>> from hfbert.tools.parity import run_parity
    >>> report = run_parity("google-bert/bert-base-uncased")  # doctest: +SKIP
    >>> print(report.table()); report.passed  # doctest: +SKIP

What runs: a fixed battery of real sentences (`hfbert/data/parity_sentences.txt`, or your own), tokenized with
the checkpoint's tokenizer (`hfbert.AutoTokenizer`: BERT's WordPiece, RoBERTa's byte-level BPE, XLM-R's Unigram,
MPNet's WordPiece), as five cases; BERT, RoBERTa, XLM-RoBERTa, CamemBERT and MPNet checkpoints alike, each loaded by
its family's classes (config.json's model_type) in both libraries:

- "single": every text alone (batch of one, no padding);
- "pairs": consecutive texts as two segments (token_type_ids 0 / 1; RoBERTa's and MPNet's `<s> A </s></s> B </s>`,
  one token type or none), batched and padded right (skipped when the model has a single token type and the
  tokenizer gives token types; where the tokenizer gives none, as XLM-R's, the pairs run as it gives them, segment
  0 throughout, even on a model with two token types, noted as not exercising distinct segments, not "untested");
- "right padding" and "left padding": the texts in batches of `batch_size`; with left padding both models get
  `position_ids = cumsum(attention_mask) - 1` (clamped at 0), so real tokens start at position 0 in both
  (RoBERTa's: from `pad_token_id + 1`, pads at `pad_token_id`, as its models count them; MPNet's from 2, pads at 1);
- "max length": one sequence exactly as long as the model takes (`max_position_embeddings`; RoBERTa's
  `max_position_embeddings - pad_token_id - 1`), the texts repeated, truncated.

The padded cases always hold padding, and "pairs" two rows of other token types: where no batch of `batch_size`
texts does (a batch size of 1, texts of one length), one batch that does is added (`build_cases`); where the texts
cannot give one, the case is marked not exercised and the verdict is "untested", never "pass".

What is compared, over real (non-pad) positions only: the embeddings output and every layer's hidden state, the
pooler (when the checkpoint has one), the attention probabilities of every layer (rows of real query tokens),
and, when the checkpoint has a masked-LM head (`cls.predictions.*`, RoBERTa's `lm_head.*`), the MLM logits and the
top-5 token ids at every real position. Attention probabilities exist only in the eager implementation: with
`attn="sdpa"` the hidden states, pooler and logits come from the sdpa models and the attention rows from an extra
eager call of both models' backbones on the same batch (marked "eager pass" in the table).

How it runs: hfbert and transformers each load the checkpoint once, as the masked-LM model when it has that head
(its backbone, with the checkpoint's pooler where there is one, gives the backbone's rows; `with_pooler`), else as
the backbone. Every batch goes through each model and is compared at once; only the running sums are kept. The
float64 reference runs once per batch, eager, for every output: eager and sdpa differ in float64 by float64
rounding (1e-16 relative), nine orders of magnitude below the float32 errors it measures, so it is exact enough for
the sdpa rows too. transformers' fp32 model runs the run's attention where it has it, else eager (MPNet: its only
one; the report says so). In float32 runs the float64 reference shares transformers' float32 weights and casts each
to float64 as it is read (`float64_twin`: what transformers' model cast to float64 computes, bit for bit, without
880 MB more for bert-base).

The verdict is anchored to exact arithmetic. transformers also runs the same inputs in float64 (the exact
reference; on CUDA on the GPU, TF32 off), and each output is judged by accuracy, not by its distance to another
fp32 run: it passes when hfbert's RMS error against float64 is at most `ACCURACY_RATIO` (1.5) times
transformers' own RMS error against float64, in the same dtype on the same device (`linear_kernel="fast"`, hfbert
through `optimize_for_inference(precision="high")`: that mode's own bound, `ACCURACY_BOUNDS["high"]`, 3x). The
allowed error never drops below eps(dtype) x the RMS of the float64 values, so that exact zeros on both sides do
not divide by zero. RMS rather than max: the maxima of two sets of rounding errors differ by up to 2x by chance,
while a less accurate kernel raises the RMS every time, and a real port bug raises it by orders of magnitude. Why
not a fixed tolerance: at bert-base scale, with the outlier hidden dimensions trained BERTs carry, transformers'
own fp32 is up to 4e-4 away from float64 and its sdpa and eager kernels differ by 4e-5; a fixed 1e-5 fails correct
ports, and a looser one misses real bugs on small models. `tolerance=ABS` (`--tolerance`) adds an absolute bound on the
distance to transformers for those who ask.

Numbers per output, over all cases, against transformers in the same dtype: max abs = max |a - b|; max rel = max
over token vectors of ||a - b|| / ||b|| (L2); mean abs = mean |a - b|; min cos = smallest cosine similarity of a
token vector (an attention row per head, a pooler vector per sequence). Then hfbert's and transformers' max abs
and RMS error against float64, and the ratio of the RMS errors. Top-5 passes when, at every position, hfbert's
top-5 ids equal the float64 model's, or differ only among tokens whose float64 logits are tied within twice the
bound (3x; 6x in the fast mode) times transformers' max abs error on that batch's logits (a tie that fp32 rounding
can break either way).

transformers is the reference, not a dependency: it is imported only inside these functions
(`pip install 'hfbert[parity]'`).

Deployed artifacts (`run_parity(..., artifacts=[...])`, `hfbert parity MODEL --artifact PATH`): an ONNX file, an
OpenVINO IR or a CTranslate2 folder runs the same batches, and each of its outputs (last_hidden_state, and
pooler_output where it has one) is judged by the same rule against the same float64 run: its RMS error as a
multiple of transformers' fp32 error (artifacts.py; `artifact_bound`, 1.5 by default). Where the checkpoint has a
sentence-transformers pipeline, its sentence embeddings are compared too (sentences.py).

The house, one concept per file: the battery (`cases.py`), the numbers and the verdict of one output (`statistics.py`),
one batch through the three models (`compare.py`), every engine behind one interface (`engines/`: transformers' models
and the float64 twin in `engines/reference.py`, each member's transformers touch points behind its adapter in
`engines/reference_adapters.py`, a deployment engine imported only when an artifact needs it), why a failing artifact
fails (`causes.py`), an artifact's verdict (`artifacts.py`, `artifact_paths.py`, `sentences.py`), the table, the JSON
and the figure (`report.py`, `artifact_report.py`, `plot.py`), and `run_parity` with its options checked once
(`run.py`).
"""

from __future__ import annotations

from converters.dtypes import DTYPES
from hfbert.tools.parity.artifact_paths import ParityPaths, resolve_paths
from hfbert.tools.parity.cases import Case, build_cases, default_texts, read_texts
from hfbert.tools.parity.engines.base import with_pooler
from hfbert.tools.parity.engines.reference import float64_twin, load_reference
from hfbert.tools.parity.report import ParityReport
from hfbert.tools.parity.run import LINEAR_KERNELS, ParityOptions, fast_mode_bound, run_parity
from hfbert.tools.parity.statistics import ACCURACY_RATIO, TOP_K, Accuracy, Row, Slice, Stats, TopKStats, allowed_error

__all__ = [
    "ACCURACY_RATIO",
    "DTYPES",
    "LINEAR_KERNELS",
    "TOP_K",
    "Accuracy",
    "Case",
    "ParityOptions",
    "ParityPaths",
    "ParityReport",
    "Row",
    "Slice",
    "Stats",
    "TopKStats",
    "allowed_error",
    "build_cases",
    "default_texts",
    "fast_mode_bound",
    "float64_twin",
    "load_reference",
    "read_texts",
    "resolve_paths",
    "run_parity",
    "with_pooler",
]
