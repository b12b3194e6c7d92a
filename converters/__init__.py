"""Reading, mapping, validating and writing BERT checkpoints for hfbert: files on disk, nothing of the model.

- `checkpoint_files`: which weight files a directory holds and their tensors (safetensors, shards, `.bin`);
- `key_map`: checkpoint names -> hfbert names, as data;
- `load_report`: what happened to every tensor;
- `loading`: the one pass that ties them together (`hfbert.BertModel.from_pretrained` calls it);
- `hub`: repo ids -> local snapshots through huggingface_hub;
- `json_files`: the one reader of a JSON file, every failure one exception naming the file;
- `tokenizer_files`: a folder's token ids without the tokenizers library (vocab.txt, vocab.json + merges.txt);
- `writing`, `saving`: safetensors shards and `save_pretrained`, atomically;
- `atomic_write`: every file written appears whole or not at all;
- `overwrite`: outputs refused when they would write over an input file or checkpoint;
- `dtypes`, `errors`: dtype names; `CheckpointError`, `CheckpointNotFoundError`.
"""

from converters.errors import CheckpointError, CheckpointNotFoundError
from converters.key_map import map_key
from converters.load_report import LoadReport

__all__ = ["CheckpointError", "CheckpointNotFoundError", "LoadReport", "map_key"]
