"""The inference floor: speed applied to a built model from outside, by swapping its modules.

- `optimize.py`: `optimize_for_inference(model)` and `restore_weights(model)`, the entry points;
- `packed.py`: `PackedLinear`, an `nn.Linear` whose CPU inference runs on weights packed once for oneDNN;
- `int8.py`: `Int8Linear` and the int8 kernels (int8 weights, activations quantized per token);
- `allocator.py`: keep freed activation memory in the process between forwards.

`hfbert.modeling` never imports this floor: the model is plain PyTorch, and nothing here changes its parameters.
"""

from hfbert.inference.optimize import optimize_for_inference, packed_layers, restore_weights

__all__ = ["optimize_for_inference", "packed_layers", "restore_weights"]
