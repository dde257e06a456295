"""Text-line framing: one record per line, for CSV or JSON Lines channels."""

from __future__ import annotations

import numpy as np

from sagemaker_dist.runtime.framing.base import Framer


class TextLineFramer(Framer):
    """Text lines split on b"\\n" (a trailing b"\\r" is dropped); the last line may lack its newline.

    A line longer than ``max_record_bytes`` is an error as soon as that many bytes of it came, newline
    or not: a stream without newlines does not fill memory.
    """

    format_name = "TextLine"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._scanned = 0  # bytes of the unfinished line at the buffer's start already searched

    def frame(self, buf, end):
        arr = np.frombuffer(buf, dtype=np.uint8, count=end)
        scanned = min(self._scanned, end)
        newlines = np.flatnonzero(arr[scanned:] == 10)
        if scanned:
            newlines += scanned
        if not len(newlines):
            self._scanned = end
            if end > self.max_record:  # the line so far, less a "\r" that a newline may follow
                so_far = end - int(arr[end - 1] == 13)
                if so_far > self.max_record:
                    raise self.too_long(so_far, 0, at_least=True)
            self.need = end + 1
            return [], [], 0, []
        starts = np.empty(len(newlines), dtype=np.int64)
        starts[0] = 0
        starts[1:] = newlines[:-1] + 1
        stops = newlines.copy()
        has_cr = stops > starts
        has_cr[has_cr] = arr[stops[has_cr] - 1] == 13
        stops -= has_cr
        lengths = stops - starts
        consumed = int(newlines[-1]) + 1
        self._scanned = 0
        if lengths.max() > self.max_record:  # one compare a chunk on the way through
            first = int(np.flatnonzero(lengths > self.max_record)[0])
            if not first:
                raise self.too_long(int(lengths[0]), 0)
            starts, lengths, consumed = starts[:first], lengths[:first], int(starts[first])  # those first
        self.need = 0
        return starts, lengths, consumed, []

    def finish(self, leftover: bytes) -> list[bytes]:
        if not leftover:
            return []
        line = leftover[:-1] if leftover.endswith(b"\r") else leftover
        if len(line) > self.max_record:
            raise self.too_long(len(line), 0)
        return [line]
