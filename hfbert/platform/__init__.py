"""What is about the machine rather than the model, on the ground floor beside `converters/`: it imports nothing
else of hfbert, and every floor above may ask it.

- `cpu.py`: the CPU's name, flags and the instruction set the kernels run on (every printed number names it), and
  the one list of the environment's caps on it, in every spelling (`ENVIRONMENT_CAPS`).
- `mkl.py`: MKL's instruction-set branch on AMD CPUs, set at `import hfbert`: the one import-time side effect of
  the package (docs/architecture.md) apart from `threads.py`'s.
- `threads.py`: torch's OpenMP threads on a shared CPU: the passive wait policy, set at `import hfbert` before torch
  loads libgomp (its import is the first line of `hfbert/__init__.py`), and a thread count no higher than the CPUs
  the process may use (its affinity, its cgroup quota).
- `allocator.py`: freed activation memory kept for the next forward (glibc's malloc thresholds).
- `onednn.py`: torch's private oneDNN ops, looked up once and defensively.
"""
