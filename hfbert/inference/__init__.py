"""The inference floor: speed applied to a built model from outside, by swapping its modules.

- `optimize.py`: `optimize_for_inference(model)` and `restore_weights(model)`, the entry points;
- `measured.py`: which kernel is faster here, timed once per process, shape and row count;
- `swapped.py`: the cache of a parameter's faster form that every swapped module shares;
- `packed.py`: `PackedLinear`, an `nn.Linear` whose CPU inference runs on weights packed once for oneDNN;
- `fused.py`: the fast fp32 mode (precision="high"): attention, feed-forward and output blocks fused;
- `int8.py`: `Int8Linear` and the int8 kernels (int8 weights, activations quantized per token);
- `compiled.py`: the int8 model's forward under torch.compile (compile=True), on a few padded shapes;
- `allocator.py`: keep freed activation memory in the process between forwards.

`hfbert.modeling` never imports this floor: the model is plain PyTorch, and nothing here changes its parameters.
"""

from hfbert.inference.optimize import ACCURACY_BOUNDS, optimize_for_inference, packed_layers, restore_weights

__all__ = ["ACCURACY_BOUNDS", "optimize_for_inference", "packed_layers", "restore_weights"]
