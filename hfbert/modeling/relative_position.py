"""MPNet's relative-position bias: which bucket a (query, key) distance falls in, and the bias it adds to scores.

MPNet (as T5) adds to every attention score a learned per-head bias that depends only on how far the key is from
the query, `key - query`, in columns. Distances are grouped into 32 buckets: half for keys before the query, half for
keys after it; within a half, 0..7 get a bucket each and 8..127 share 8 buckets spaced logarithmically; 128 and more
share the last. One table, `encoder.relative_attention_bias` (buckets x heads), serves every layer.

    >>> relative_position_bucket(torch.tensor([0, -1, 1, -7, 8, -200, 200])).tolist()
    [0, 1, 17, 7, 24, 15, 31]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

# transformers' MPNetEncoder calls its bucketing with these defaults, whatever relative_attention_num_buckets says.
NUM_BUCKETS = 32
MAX_DISTANCE = 128


def relative_position_bucket(relative_position: Tensor) -> Tensor:
    """Bucket index in [0, 32) of each `key - query` distance (an integer tensor of any shape)."""
    half = NUM_BUCKETS // 2
    distance = -relative_position  # query - key: positive for keys before the query
    bucket = (distance < 0).long() * half  # keys after the query use the upper half
    distance = distance.abs()
    exact = half // 2
    # Logarithmic buckets beyond `exact`, computed in float32 as transformers does, so the boundaries agree.
    logarithmic = exact + (torch.log(distance.float() / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)).long()
    logarithmic = logarithmic.clamp(max=half - 1)
    return bucket + torch.where(distance < exact, distance, logarithmic)


def relative_position_bias(table: nn.Embedding, length: int) -> Tensor:
    """(1, heads, length, length): the bias of every (query, key) column pair of a `length`-column batch."""
    columns = torch.arange(length, device=table.weight.device)
    buckets = relative_position_bucket(columns[None, :] - columns[:, None])
    return table(buckets).permute(2, 0, 1).unsqueeze(0)
