"""What a reader pays for its batch buffers on a GPU host, and for the TFRecord CRC, per gigabyte.

In a fresh process per allocator setting (``PYTORCH_CUDA_ALLOC_CONF``), ``--count`` buffers of
``--mb`` MB (a batch of 256 records of 150 KB is 38.5 MB) are taken from torch's caching host
allocator (``pin_memory=True``), then written once, then freed and taken again (the allocator's cache)
and written again; and, as a reference, anonymous maps of plain pages written once. Each figure is GB/s
of buffer (higher is cheaper), the median of ``--repeats`` processes, settings interleaved. The CRC
line is ``masked_crc32c`` of the compiled reader over one record held in cache.

    python3 bench/pinned_alloc.py [--mb 38.5] [--count 8] [--repeats 3] [--conf SETTING ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipe_reader import rotated  # noqa: E402

CHILD = """
import json, mmap, sys, time
import numpy as np
import torch
nbytes, count = int(sys.argv[1]), int(sys.argv[2])
pinned = torch.cuda.is_available()
if pinned:
    torch.empty(1, pin_memory=True)  # CUDA and the allocator up, not timed
src = np.full(nbytes, 7, dtype=np.uint8)

def timed(make):
    start = time.perf_counter()
    buffers = [make() for _ in range(count)]
    made = time.perf_counter()
    for b in buffers:
        b[:] = src
    return buffers, made - start, time.perf_counter() - made

out = {}
plain = lambda: np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)
buffers, made, wrote = timed(plain)
out["plain: map + first write"] = made + wrote
del buffers
if pinned:
    pin = lambda: torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
    buffers, made, wrote = timed(pin)
    out["pinned: allocate"], out["pinned: first write"] = made, wrote
    del buffers
    buffers, made, wrote = timed(pin)
    out["pinned: from the cache + write"] = made + wrote
print(json.dumps({k: count * nbytes / v / 1e9 for k, v in out.items()}))
"""


def crc_rate(record_bytes: int = 150_000, rounds: int = 2000) -> float | None:
    """GB/s of the compiled reader's masked CRC32C over one record in cache (None: not built)."""
    sys.path.insert(0, str(REPO))
    try:
        from sagemaker_dist.runtime.framing import _record_reader
    except ImportError:
        return None
    data = os.urandom(record_bytes)
    _record_reader.masked_crc32c(data)
    start = time.perf_counter()
    for _ in range(rounds):
        _record_reader.masked_crc32c(data)
    return rounds * record_bytes / (time.perf_counter() - start) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=38.5)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--conf", nargs="*",
        default=["", "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"],
        help="PYTORCH_CUDA_ALLOC_CONF values to compare ('' is torch's defaults)",
    )  # fmt: skip
    args = parser.parse_args()
    nbytes = int(args.mb * (1 << 20))
    runs: dict[str, list[dict]] = {conf: [] for conf in args.conf}
    for round_ in range(args.repeats):
        for conf in rotated(args.conf, round_):
            env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf}
            argv = [sys.executable, "-c", CHILD, str(nbytes), str(args.count)]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=True)
            runs[conf].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.count} buffers of {nbytes / 1e6:.1f} MB, GB/s of buffer, {args.repeats} processes")
    for conf, results in runs.items():
        figures = {k: round(statistics.median(r[k] for r in results), 2) for k in results[0]}
        print(f"  PYTORCH_CUDA_ALLOC_CONF={conf!r}: {json.dumps(figures)}")
    rate = crc_rate()
    print(f"masked CRC32C, 150 KB record in cache: {rate:.1f} GB/s" if rate else "CRC: reader not built")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
