"""hfbert's benchmarks, run as modules from the repository root: `python -m benchmarks.peers`, ...

Each one prints its tables; `--update-docs` also writes its JSON result to docs/results/ and renders it into
docs/ (`benchmarks/report.py`), and `--render JSON` renders an existing result without measuring.
"""
