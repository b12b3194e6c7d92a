"""Moved to `hfbert.platform.cpu` (what is about the machine has a room of its own); this name is kept for old
imports."""

from hfbert.platform.cpu import *  # noqa: F403
