"""Planted pickles for the tests that check nothing unpickles untrusted files."""

from __future__ import annotations

import os


class Payload:
    """A pickle whose unpickling creates the folder ``marker``: proof that its code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))
