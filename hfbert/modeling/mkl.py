"""Moved to `hfbert.platform.mkl` (what is about the machine has a room of its own); this name is kept for old
imports."""

from hfbert.platform.mkl import *  # noqa: F403
