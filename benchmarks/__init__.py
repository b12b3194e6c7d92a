"""hfbert's benchmarks, run as modules from the repository root: `python -m benchmarks.peers`, ...

Each one prints its tables; `--update-docs` also writes its JSON result to docs/results/ and renders it into
docs/ (`benchmarks/report.py`), and `--render JSON` renders an existing result without measuring. Every run records
how busy other processes kept the cores; `--update-docs` refuses a run where they kept more than 0.3 of a core busy,
unless `--allow-busy`, and the docs then say so (`benchmarks/busy.py`).
"""
