"""The exceptions checkpoint problems raise."""


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint that cannot be loaded as asked. The message names the file and the tensor or field.

    A `ValueError` (a bad input file), and also the `RuntimeError` that torch's `load_state_dict` raises for the
    same problems, so code written against either catches it."""


class CheckpointNotFoundError(CheckpointError, OSError):
    """No checkpoint where one was asked for: a path that does not exist or is not a folder, a repo id or revision
    the Hub does not have (or that is not in the cache when offline), a repo without weights.

    Also an `OSError`, as transformers raises there, so the `except OSError` fallbacks written around
    `from_pretrained` (try a local folder, then another loader) catch it."""
