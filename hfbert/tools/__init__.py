"""The tools floor: jobs built on the model, each in its own file, each behind a CLI command (`hfbert/cli.py`).

- `parity.py`: `hfbert parity`, hfbert against transformers against float64;
- `embedding.py`: `hfbert embed` and `Embedder`, sentence embeddings;
- `convert.py`, `inspect.py`: `hfbert convert` and `hfbert inspect`;
- `texts.py`: reading input texts, one per line;
- `extras.py`: optional dependencies, imported with one clear error when missing;
- `sentence_transformers_backbone.py`: hfbert as the encoder of a `SentenceTransformer`.
"""
