"""The one exception every checkpoint problem raises."""


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint that cannot be loaded as asked. The message names the file and the tensor or field.

    A `ValueError` (a bad input file), and also the `RuntimeError` that torch's `load_state_dict` raises for the
    same problems, so code written against either catches it."""
