"""Test helpers: checkpoint builders, the fake Hub, shared configs, inputs and measures."""
