"""Text-line framing: one record per line, for CSV or JSON Lines channels."""

from __future__ import annotations

import numpy as np

from sagemaker_dist.runtime.framing.base import Framer


class TextLineFramer(Framer):
    """Text lines split on b"\\n" (a trailing b"\\r" is dropped); the last line may lack its newline."""

    format_name = "TextLine"

    def frame(self, buf, end):
        arr = np.frombuffer(buf, dtype=np.uint8, count=end)
        newlines = np.flatnonzero(arr == 10)
        if not len(newlines):
            self.need = end + 1
            return [], [], 0, []
        starts = np.empty(len(newlines), dtype=np.int64)
        starts[0] = 0
        starts[1:] = newlines[:-1] + 1
        stops = newlines.copy()
        has_cr = stops > starts
        has_cr[has_cr] = arr[stops[has_cr] - 1] == 13
        stops -= has_cr
        self.need = 0
        return starts, stops - starts, int(newlines[-1]) + 1, []

    def finish(self, leftover: bytes) -> list[bytes]:
        if not leftover:
            return []
        return [leftover[:-1] if leftover.endswith(b"\r") else leftover]
