"""The one exception every checkpoint problem raises."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked. The message names the file and the tensor or field."""
