"""Data: the input batches a run feeds its model.

Public names: Batches, Batch, build_data, DATA_KINDS, IMAGE_EXTENSIONS, IMAGENET_MEAN,
IMAGENET_STD, as_batch, data_params, default_data.
"""

from __future__ import annotations

from hookgraph.data.build import DATA_KINDS, IMAGE_EXTENSIONS, IMAGENET_MEAN, IMAGENET_STD, Batch, Batches, build_data
from hookgraph.data.sources import as_batch, data_params, default_data

__all__ = [
    "Batches",
    "Batch",
    "build_data",
    "DATA_KINDS",
    "IMAGE_EXTENSIONS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "as_batch",
    "data_params",
    "default_data",
]
