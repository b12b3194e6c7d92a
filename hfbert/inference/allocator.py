"""Moved to `hfbert.platform.allocator` (what is about the machine has a room of its own); this name is kept for old
imports."""

from hfbert.platform.allocator import *  # noqa: F403
