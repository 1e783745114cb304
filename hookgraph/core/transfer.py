"""Device-to-host copies that do not stall the forward pass.

Public names: HostCopier.

A blocking ``.cpu()`` in a hook waits for the GPU at every call (tens of times slower on
a large model). Copies here go into pinned host buffers, on a side stream per device, so
the host never waits inside a hook; :meth:`HostCopier.synchronize` waits once, before
anyone reads the copies (``HookGraph.records`` and the run folder's flush call it).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["HostCopier"]


class HostCopier:
    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._pending = False

    def to_host(self, t: Tensor) -> Tensor:
        """A CPU copy of ``t``: asynchronous for CUDA tensors, a plain copy otherwise.

        Always a new tensor, CPU input included: the caller may keep it while ``t`` is
        changed in place, as with the pinned buffer of the CUDA path.
        """
        if not t.is_cuda:
            return t.to("cpu", copy=True)  # .to("cpu") alone returns a CPU tensor itself
        stream = self._streams.get(t.device)
        if stream is None:
            stream = self._streams[t.device] = torch.cuda.Stream(device=t.device)
        # The copy must see the value the compute stream produced, and the caching
        # allocator must not hand t's memory to someone else before the copy is done.
        stream.wait_stream(torch.cuda.current_stream(t.device))
        out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        with torch.cuda.stream(stream):
            out.copy_(t, non_blocking=True)
        t.record_stream(stream)
        self._pending = True
        return out

    def synchronize(self) -> None:
        """Wait for every copy started so far (no-op when none is pending)."""
        if self._pending:
            for stream in self._streams.values():
                stream.synchronize()
            self._pending = False
