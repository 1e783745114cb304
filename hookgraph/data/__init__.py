"""Data: the input batches a run feeds its model.

Public names: Batches, Batch, build_data, DATA_KINDS, DataKind, DataContext, register_data,
IMAGE_EXTENSIONS, IMAGENET_MEAN, IMAGENET_STD, as_batch, default_data, section_options.

Modules: build (the front door), registry (kinds by name, their keys, the split over
ranks), kinds/ (the built-in kinds, one module per family), batches (the stream every kind
returns), values (checks the kinds share), shard (each rank's part of a global batch),
section (a run config's data section as options), prompts (token-id prompts as a Dataset).
"""

from __future__ import annotations

from hookgraph.data.batches import Batch, Batches
from hookgraph.data.build import build_data
from hookgraph.data.kinds.auto import default_data
from hookgraph.data.kinds.datasets import as_batch
from hookgraph.data.kinds.images import IMAGE_EXTENSIONS
from hookgraph.data.registry import DATA_KINDS, DataContext, DataKind, register_data
from hookgraph.data.section import section_options
from hookgraph.data.values import IMAGENET_MEAN, IMAGENET_STD

__all__ = [
    "Batches",
    "Batch",
    "build_data",
    "DATA_KINDS",
    "DataKind",
    "DataContext",
    "register_data",
    "IMAGE_EXTENSIONS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "as_batch",
    "default_data",
    "section_options",
]
