"""The tools floor: jobs built on the model, each in its own file, each behind a CLI command (`hfbert/cli.py`).

- `parity/`: `hfbert parity`, hfbert against transformers against float64;
- `embedding.py`: `hfbert embed` and `Embedder`, sentence embeddings; `embedding_output.py`: where they are written;
- `sentence_transformers_pipeline.py`: a checkpoint's sentence-transformers pipeline (pooling, Dense, Normalize),
  read from its files into the modules of `sentence_transformers_modules.py`, for `Embedder` and parity;
- `convert.py`, `inspect.py`: `hfbert convert` and `hfbert inspect`;
- `texts.py`: reading input texts, one per line, once (`-`: standard input);
- `progress.py`: progress on stderr, a bar on a terminal and lines in a log;
- `extras.py`: optional dependencies, imported with one clear error when missing;
- `sentence_transformers_backbone.py`: hfbert as the encoder of a `SentenceTransformer`;
- `retrieval.py`: the retrieval encoders' one base (folder, tokenizer, model, `LoadOptions`, length-sorted batches
  in input order) under `Embedder`, `CrossEncoder`, `SparseEncoder`;
- `reranking.py`: `CrossEncoder` and `hfbert rerank`; `sparse.py`: `SparseEncoder` and `embed --sparse`;
  `bge_m3.py`: bge-m3's dense, lexical and ColBERT outputs; `head_checkpoint.py`: what they share (the folder,
  its head model, the input length).
"""
