"""Reading, mapping and validating BERT checkpoints for hfbert.

- `checkpoint_files`: which weight files a directory holds and their tensors (safetensors, shards, `.bin`);
- `key_map`: checkpoint names -> hfbert names, as data;
- `load_report`: what happened to every tensor;
- `hub`: repo ids -> local snapshots through huggingface_hub;
- `overwrite`: outputs refused when they would write over an input file or checkpoint;
- `loading`: the one pass that ties them together (`hfbert.BertModel.from_pretrained` calls it).
"""

from converters.errors import CheckpointError, CheckpointNotFoundError
from converters.key_map import map_key
from converters.load_report import LoadReport

__all__ = ["CheckpointError", "CheckpointNotFoundError", "LoadReport", "map_key"]
