"""The malloc thresholds a PipeModeDataset sets: observed in glibc itself, in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# A fresh process allocates a 4 MiB block, the size of a read chunk's tensors, and reports whether
# glibc mapped it from the kernel (hblkhd: bytes in mmapped blocks; mallinfo2 from glibc 2.33, the
# older mallinfo's int fields before it).
PROBE = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None)
field = ctypes.c_size_t if hasattr(libc, "mallinfo2") else ctypes.c_int
class Info(ctypes.Structure):
    _fields_ = [(n, field) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2 = getattr(libc, "mallinfo2", None) or libc.mallinfo
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
applied = {}
if sys.argv[1] == "tune":
    import logging
    logging.basicConfig(level=logging.INFO, format="LOG %(message)s", stream=sys.stderr)
    from sagemaker_dist.runtime.malloc_tuning import tune_malloc
    applied = tune_malloc()
    assert tune_malloc() == applied  # once per process
before = libc.mallinfo2().hblkhd
block = libc.malloc(4 << 20)
print(json.dumps({"applied": applied, "mapped": libc.mallinfo2().hblkhd - before}))
"""


def probe(mode: str, **env) -> dict:
    ours = ("MALLOC_", "SAGEMAKER_DIST_MALLOC_TUNING")
    base = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env={**base, **env}, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    logged = [line[4:] for line in out.stderr.splitlines() if line.startswith("LOG ")]
    return {**json.loads(out.stdout), "log": logged}


@pytest.fixture(scope="module", autouse=True)
def _glibc():
    # the thresholds are glibc's; so is every supported machine (TensorFlow's wheels need glibc)
    assert os.confstr("CS_GNU_LIBC_VERSION"), "not glibc: no malloc thresholds to observe"


def test_untuned_glibc_maps_a_chunk_sized_block_from_the_kernel():
    assert probe("plain")["mapped"] >= 4 << 20  # the first-epoch page faults the tuning removes


def test_tuning_takes_chunk_sized_blocks_from_the_heap():
    from sagemaker_dist.runtime.malloc_tuning import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES

    result = probe("tune")
    assert result["applied"] == {
        "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD_BYTES,
        "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD_BYTES,
    }
    assert result["mapped"] == 0
    assert result["log"] == [  # once, though tune_malloc() ran twice
        "malloc tuning for the Pipe-mode reader: mmap threshold glibc's dynamic default (128 KiB at start) "
        "-> 8 MiB; trim threshold glibc's dynamic default (128 KiB at start) -> 64 MiB "
        "(SAGEMAKER_DIST_MALLOC_TUNING=0 turns this off)"
    ]


def test_the_environment_wins_and_the_tuning_can_be_turned_off():
    # The user's own threshold (128 KiB) stays: the block is mapped, and only the trim threshold is set.
    result = probe("tune", MALLOC_MMAP_THRESHOLD_="131072")
    assert list(result["applied"]) == ["MALLOC_TRIM_THRESHOLD_"]
    assert result["mapped"] >= 4 << 20
    assert result["log"] == [
        "malloc tuning for the Pipe-mode reader: mmap threshold left at 131072 (MALLOC_MMAP_THRESHOLD_ in "
        "the environment); trim threshold glibc's dynamic default (128 KiB at start) -> 64 MiB "
        "(SAGEMAKER_DIST_MALLOC_TUNING=0 turns this off)"
    ]
    both = probe("tune", MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="262144")
    assert both["applied"] == {} and "trim threshold left at 262144" in both["log"][0]
    assert both["log"][0].endswith("(nothing changed)")
    off = probe("tune", SAGEMAKER_DIST_MALLOC_TUNING="0")
    assert off["applied"] == {} and off["mapped"] >= 4 << 20
    assert off["log"] == [
        "malloc tuning: mmap and trim thresholds left as they are (SAGEMAKER_DIST_MALLOC_TUNING=0)"
    ]


def test_building_a_pipe_mode_dataset_tunes_malloc(tmp_path):
    (tmp_path / "input" / "config").mkdir(parents=True)
    (tmp_path / "input" / "config" / "inputdataconfig.json").write_text(
        json.dumps({"train": {"TrainingInputMode": "Pipe"}})
    )
    # tune_malloc() runs once per process, so the check is that a dataset's build is what set them.
    script = (
        "import json, sys\n"
        "from sagemaker_dist.runtime import PipeModeDataset\n"
        "from sagemaker_dist.runtime import malloc_tuning\n"
        "assert malloc_tuning._applied is None\n"
        f"PipeModeDataset('train', 'TFRecord', config_dir={str(tmp_path / 'input' / 'config')!r})\n"
        "print(json.dumps(malloc_tuning._applied))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) == {
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
    }
