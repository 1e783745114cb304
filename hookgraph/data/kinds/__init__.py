"""The built-in data kinds, one module per family; importing this package registers them.

Modules: generated (none, random, tokens), images (fake, images), datasets (custom,
torchvision), text (text), auto (the model's own default input). A new kind is one more
module with its config and a ``@register_data`` builder (see :mod:`hookgraph.data.registry`).
"""

from hookgraph.data.kinds import auto, datasets, generated, images, text

__all__ = ["auto", "datasets", "generated", "images", "text"]
