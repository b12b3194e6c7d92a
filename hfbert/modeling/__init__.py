"""The model floor: what a checkpoint of the family becomes in PyTorch, in plain modules.

- `family.py`: the family table, one `Member` row per model_type; every registry is read from it;
- `config.py`: `EncoderConfig`, what every member's config shares (generic fields, reading, validation, saving), and
  `BertConfig`, the typed mirror of BERT's config.json (another member's config class lives in its model file);
- `encoder.py`: `EncoderModel`, the encoder's forward written once (checks, positions, layout, embeddings, the layer
  loop, outputs) with the hooks a member fills, and the layer protocol (`EncoderLayer`);
- `model.py`: `BertModel`, BERT's encoder top to bottom (embeddings, layers, pooler);
- `roberta.py`: RoBERTa, XLM-RoBERTa and CamemBERT, BERT with named differences, and their heads;
- `mpnet.py`: MPNet, BERT's encoder with other names and a relative-position bias, and its heads;
- `distilbert.py`: DistilBERT, BERT's encoder with other names, no token types and no pooler, and its heads;
- `electra.py`: ELECTRA, BERT's encoder after a factorized embedding, its discriminator and generator heads;
- `deberta_v2.py`: DeBERTa-v2 / v3, BERT's layer shape with disentangled attention (relative c2p / p2c terms as a
  score term), and its heads;
- `modernbert.py`: ModernBERT, its own encoder top to bottom (pre-LayerNorm, rotary, local windows, GeGLU), its heads;
- `task.py`: what every member's task models share (`TaskModel`, `MaskedLanguageModel`), and transformers' losses
  and pooling rules as functions;
- `heads.py`: BERT's task models (`BertForMaskedLM`, ...);
- `shared_heads.py`: the heads RoBERTa and MPNet both have (`lm_head`, `classifier.dense / out_proj`);
- `auto.py`: `AutoModel*`, the class config.json's model_type names;
- `attention.py`: multi-head attention, eager and sdpa;
- `local_attention.py`: attention within a window, computed as a band (cost length x window);
- `positions.py`: position schemes (absolute, after the padding index, rotary);
- `rotary.py`: rotary position embeddings (the angle tables, the rotation);
- `relative_position.py`: MPNet's relative-position buckets and bias;
- `padding.py`: padded and padding-free batch layouts, the attention context they carry, and which one a call runs;
- `pretrained.py`: what every model shares with transformers' (`from_pretrained`, `save_pretrained`, tying,
  resizing, checkpointing);
- `checkpointing.py`: `Checkpointing`, which encoder layers are recomputed in the backward pass, and how;
- `inputs.py`, `outputs.py`, `activations.py`: argument checks, output classes, `hidden_act` formulas;
- `tokenizer.py`, `tokenizer_files.py`: the checkpoint's tokenizer (WordPiece, byte-level BPE, SentencePiece) and
  what its files say.

It imports the checkpoint floor (`converters`) and the platform floor below it and nothing above it: no inference
kernel, no tool.
"""
