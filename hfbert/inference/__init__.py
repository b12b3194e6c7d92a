"""The inference floor: speed applied to a built model from outside, by swapping its modules.

- `optimize.py`: `optimize_for_inference(model)`, its table of modes and their accuracy bounds (`ACCURACY_BOUNDS`,
  `SPARSE_BOUNDS`), `restore_weights(model)`, `packed_layers` and `inference_mode_of` (what was applied);
- `measured.py`: which kernel is faster here, timed once per machine, shape and row count;
- `kernel_cache.py`: those choices kept on disk for later processes, keyed by CPU, torch, caps and threads;
- `swapped.py`: the one swap protocol (same parameters, build then swap, restore), the one per-call gate "kernel or
  plain", the form's cache that follows the parameters, `refresh(model)`;
- `packed.py`: the fp32 oneDNN products (blocked and whole-width kernels) and `PackedLinear`;
- `int8.py`: the int8 product (int8 weights, activations quantized per token), its kernel and `Int8Linear`;
- `bf16.py`: the bf16 mode's product (bf16 weights and inputs, fp32 sums and the rest in fp32) and `BF16Linear`;
- `fused.py`: blocks computed as one product, the fast fp32 mode (int8 attention is its attention block, given the
  int8 kernel as a value);
- `compiled.py`: the int8 model's forward under torch.compile (compile=True), on a few padded shapes;
- `aot.py`: the forward exported and compiled ahead of time by AOTInductor (compile="aot"), one package per input
  variant with dynamic shapes, kept on disk keyed by the weights, torch and the CPU.

What they ask of the machine (the instruction set, oneDNN's ops, the allocator) is in `hfbert.platform`.

`hfbert.modeling` never imports this floor: the model is plain PyTorch, and nothing here changes its parameters.
"""

from hfbert.inference.optimize import (
    ACCURACY_BOUNDS,
    MODES,
    PRECISIONS,
    SPARSE_BOUNDS,
    AppliedMode,
    inference_mode_of,
    optimize_for_inference,
    packed_layers,
    restore_weights,
)
from hfbert.inference.swapped import refresh

__all__ = [
    "ACCURACY_BOUNDS",
    "MODES",
    "PRECISIONS",
    "SPARSE_BOUNDS",
    "AppliedMode",
    "inference_mode_of",
    "optimize_for_inference",
    "packed_layers",
    "refresh",
    "restore_weights",
]
