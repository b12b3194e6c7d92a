"""The model floor: what a BERT checkpoint becomes in PyTorch, in plain modules.

- `config.py`: `BertConfig`, the typed mirror of config.json;
- `model.py`: `BertModel`, the encoder top to bottom (embeddings, layers, pooler);
- `attention.py`: multi-head attention, eager and sdpa;
- `padding.py`: padded and padding-free batch layouts, and which one a call runs;
- `heads.py`: the task models (`BertForMaskedLM`, ...);
- `pretrained.py`: what every model shares with transformers' (`from_pretrained`, `save_pretrained`, tying,
  resizing, checkpointing);
- `checkpointing.py`: `Checkpointing`, which encoder layers are recomputed in the backward pass, and how;
- `inputs.py`, `outputs.py`, `activations.py`: argument checks, output classes, `hidden_act` formulas;
- `tokenizer.py`: `BertTokenizer`, the checkpoint's WordPiece tokenizer;
- `cpu.py`: what this CPU computes natively (the bf16 warning and the inference floor read it).
- `mkl.py`: MKL's fast branch on AMD CPUs (`MKL_CBWR`), chosen when `import hfbert` runs.

It imports the checkpoint floor (`converters`) below it and nothing above it: no inference kernel, no tool.
"""
