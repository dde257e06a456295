"""Which reader a PipeModeDataset runs: the compiled tf.data op, built here at first use, or Python's.

AWS's reader was a C++ op prebuilt per TensorFlow version, and it stopped with the last version AWS
built it for. Ours is compiled where it runs, against the TensorFlow installed there
(``tf.sysconfig`` flags), into ``$SAGEMAKER_DIST_CACHE/ops/<key>/`` (default
``~/.cache/sagemaker-dist``), keyed by the TensorFlow version, its compile and link flags (ABI), the
compiler and our version and source; later processes only load it. Concurrent ranks build it once
(a lock file; the library is written to a temporary name and renamed). With no compiler, or a
build that fails or takes longer than ``BUILD_TIMEOUT``, the Python reader runs. One log line
says which reader runs and why. ``SAGEMAKER_DIST_READER=python|compiled|auto`` (default auto)
forces a reader; ``compiled`` where it cannot be built is an error naming why.
The cache is loaded from only where no other user can have written: the cache root and every folder
down to the key's must be this user's (or root's), not links and not writable by group or others,
and the root's parent too unless sticky (``/tmp``); the ``.so`` must be a regular file of ours that
only we can write (``lstat``: never through a link). Folders it creates are mode 0700, the lock file
0600, opened without following links (``O_NOFOLLOW``); a ``build-failed.txt`` counts only where it is
ours and starts with the build's command line as we write it (another is ignored, with a log line).
Where the cache cannot be trusted, auto runs the Python reader with a warning naming why, and
compiled is an error naming why (``runtime.trusted_cache``).
``python -m sagemaker_dist.runtime.tensorflow.data.native_build`` builds it now and reads records back with it
(scripts/setup.sh and scripts/tf-latest-check.sh do, so jobs find it built).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sagemaker_dist import __version__
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime import environment
from sagemaker_dist.runtime.trusted_cache import (
    UntrustedCacheError,
    check_path,
    create_new,
    open_trusted,
    trusted_dir,
)

log = logging.getLogger(__name__)

READER_ENV = environment.READER
READERS = ("auto", "compiled", "python")
CACHE_ENV = environment.CACHE
SOURCE = Path(__file__).resolve().parent / "native" / "pipe_dataset_op.cc"  # includes native/*.h
# the framing core (CRC32C, frame rules) it shares with the Python extensions: the core's
# framing/native/record_core.h, found from the runtime's root (tensorflow/data/ is two levels below it)
CORE = Path(__file__).resolve().parents[2] / "framing" / "native"
LIBRARY = "pipe_dataset_op.so"
FAILED = "build-failed.txt"  # in the key's folder: auto mode does not retry a failed build
LOCK = ".lock"
CACHE_HINT = f"set {CACHE_ENV} to a folder of your own"
BUILD_TIMEOUT = 300.0  # seconds for the compiler (about 40 s on 2 busy cores), and for the lock
OP_NAME = "sagemaker_dist_pipe_dataset"

_loaded: dict[str, object] = {}  # reader setting -> op module (or None for Python), once per process


class NativeReaderError(ConfigurationError):
    """The compiled reader was asked for (SAGEMAKER_DIST_READER=compiled) and cannot be built or loaded."""


class _Unavailable(Exception):
    """Why the compiled reader cannot run here (the message says so)."""


def reader_setting() -> str:
    value = environment.reader()
    if value not in READERS:
        raise ConfigurationError(f"{READER_ENV}={value!r}; use one of {', '.join(READERS)}")
    return value


def compiled_op():
    """The compiled op's module, or None where the Python reader runs (logged once per process)."""
    setting = reader_setting()
    if setting in _loaded:
        return _loaded[setting]
    if setting == "python":
        log.info("PipeModeDataset: the Python reader runs (%s=python)", READER_ENV)
        module = None
    else:
        try:
            module, how = _load(force=setting == "compiled")
        except _Unavailable as why:
            if setting == "compiled":
                raise NativeReaderError(
                    f"{READER_ENV}=compiled, but the compiled reader cannot run: {why}"
                ) from None
            log.warning("PipeModeDataset: the Python reader runs: the compiled reader cannot (%s)", why)
            module = None
        else:
            log.info("PipeModeDataset: the compiled reader runs (%s)", how)
    _loaded[setting] = module
    return module


def cache_root() -> Path:
    default = Path(environment.cache_home() or Path.home() / ".cache") / "sagemaker-dist"
    return Path(environment.cache() or default)


def build_plan(tf) -> tuple[list[str], Path]:
    """(compiler command without the output, the library's path in the cache) for this TensorFlow."""
    compiler = environment.compiler() or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise _Unavailable("no C++ compiler: install g++ (Debian: build-essential), or set CXX")
    flags = [*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    command = [compiler, "-std=c++17", "-shared", "-fPIC", "-O2", f"-I{CORE}", str(SOURCE), *flags]
    key = hashlib.sha256("\0".join([tf.__version__, __version__, os.uname().machine, *command]).encode())
    for source in [*sorted(SOURCE.parent.glob("*.[ch]*")), *sorted(CORE.glob("*.h"))]:
        key.update(source.read_bytes())
    key = key.hexdigest()[:16]
    return command, cache_root() / "ops" / f"tf{tf.__version__}-{key}" / LIBRARY


def _load(force: bool):
    """(op module, how it came) — loaded from the cache, else built first; _Unavailable says why not."""
    import tensorflow as tf

    for source in (SOURCE, CORE / "record_core.h"):
        if not source.is_file():
            raise _Unavailable(f"its source {source} is not installed")
    command, planned = build_plan(tf)
    library = _trusted_folder(planned) / LIBRARY  # checked before anything in it is used
    how = f"TensorFlow {tf.__version__}, {library}"
    if not os.path.lexists(library):
        started = time.monotonic()
        _build(command, planned, force)
        how += f", built in {time.monotonic() - started:.0f} s"
    try:
        check_path(library, "file", hint=CACHE_HINT)
    except UntrustedCacheError as exc:
        raise _Unavailable(f"the build cache is not safe to load from: {exc}") from None
    try:
        module = tf.load_op_library(str(library))
    except Exception as exc:  # noqa: BLE001 - any load failure means: the Python reader
        raise _Unavailable(f"{library} does not load: {exc}") from None
    if not hasattr(module, OP_NAME):
        raise _Unavailable(f"{library} has no op {OP_NAME}")
    return module, how


def _trusted_folder(library: Path) -> Path:
    """The key's folder of ``library``, created (0700) and checked from the cache root down."""
    try:
        return trusted_dir(library.parent, root=cache_root(), hint=CACHE_HINT)
    except UntrustedCacheError as exc:
        raise _Unavailable(f"the build cache is not safe to load from: {exc}") from None
    except OSError as exc:
        raise _Unavailable(f"cannot create the build cache {library.parent}: {exc}") from None


def _failure_token(command: list[str]) -> bytes:
    """How a ``build-failed.txt`` we wrote for this build starts."""
    return (" ".join(command) + "\n\n").encode()


def _failed_before(failed: Path, command: list[str]) -> bool:
    """Whether ``failed`` is our record of this very build failing; one that is not is ignored."""
    token = _failure_token(command)
    try:
        fd = open_trusted(failed, os.O_RDONLY, hint=CACHE_HINT)
    except FileNotFoundError:
        return False
    except (UntrustedCacheError, OSError) as exc:
        log.warning("PipeModeDataset: ignoring %s: %s", failed, exc)
        return False
    with os.fdopen(fd, "rb") as f:
        head = f.read(len(token))
    if head != token:
        log.warning("PipeModeDataset: ignoring %s: it is not the record of this build's failure", failed)
        return False
    return True


def _build(command: list[str], library: Path, force: bool) -> None:
    """Compile into ``library`` once, however many processes ask at the same time."""
    folder = _trusted_folder(library)
    library = folder / library.name
    failed = folder / FAILED
    try:
        fd = open_trusted(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o600, hint=CACHE_HINT)
    except UntrustedCacheError as exc:
        raise _Unavailable(f"the build cache is not safe to use: {exc}") from None
    except OSError as exc:
        raise _Unavailable(f"cannot write to the build cache {folder}: {exc}") from None
    with os.fdopen(fd, "r+b") as lock:
        _lock(lock, folder)
        if os.path.lexists(library):  # another process built it while this one waited
            return
        if not force and _failed_before(failed, command):
            raise _Unavailable(f"it failed to build before (see {failed}; {READER_ENV}=compiled retries)")
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
        os.close(fd)
        try:
            done = subprocess.run(
                [*command, "-o", tmp], capture_output=True, text=True, timeout=BUILD_TIMEOUT
            )
        except subprocess.TimeoutExpired:
            os.unlink(tmp)
            raise _Unavailable(f"the build took longer than {BUILD_TIMEOUT:g} s") from None
        except OSError as exc:
            os.unlink(tmp)
            raise _Unavailable(f"the compiler {command[0]} did not run: {exc}") from None
        if done.returncode != 0:
            os.unlink(tmp)
            failed.unlink(missing_ok=True)  # ours, or one that was ignored: replaced by ours
            try:
                create_new(failed, _failure_token(command) + done.stderr.encode(errors="replace"))
            except OSError as exc:
                log.warning("PipeModeDataset: could not record the failed build in %s: %s", failed, exc)
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise _Unavailable(
                f"the build failed ({command[0]} exited {done.returncode}: {last}; see {failed})"
            )
        os.chmod(tmp, 0o755)  # mkstemp made it 0600; readable by all, writable only by us
        os.replace(tmp, library)
        failed.unlink(missing_ok=True)


def _lock(lock, folder: Path) -> None:
    deadline = time.monotonic() + BUILD_TIMEOUT
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise _Unavailable(f"another process held {folder / LOCK} for {BUILD_TIMEOUT:g} s") from None
            time.sleep(0.2)


def self_check() -> str:
    """Build (retrying a failed build), load, and read a stream of small and large records back."""
    import tempfile

    from sagemaker_dist.contract.record_formats import encode_tfrecord

    environment.set_variable(READER_ENV, "compiled")
    _loaded.clear()
    for marker in cache_root().glob(f"ops/*/{FAILED}"):
        marker.unlink(missing_ok=True)
    op = compiled_op()
    from sagemaker_dist.runtime.tensorflow.data.compiled_dataset import compiled_dataset

    records = [os.urandom(n) for n in (0, 1, 100, 40_000, 300_000)] * 20
    with tempfile.TemporaryDirectory(prefix="sagemaker-dist-reader-check-") as tmp:
        (Path(tmp) / "check_0").write_bytes(b"".join(encode_tfrecord(r) for r in records))
        args = ("check", "TFRecord", tmp, tmp, False, 0, 0, 5.0)
        got = [r.numpy() for r in compiled_dataset(op, *args, batch_size=None, drop_remainder=False)]
        batches = compiled_dataset(op, *args, batch_size=7, drop_remainder=False)
        (Path(tmp) / "check_1").write_bytes(b"".join(encode_tfrecord(r) for r in records))
        batched = [r for b in batches for r in b.numpy().tolist()]
    if got != records or batched != records:
        raise NativeReaderError("the compiled reader read back other records than were written")
    import tensorflow as tf

    return f"the compiled reader reads TFRecords on TensorFlow {tf.__version__} ({build_plan(tf)[1]})"


if __name__ == "__main__":  # python -m ...tensorflow.data.native_build: build it now, and check it
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(self_check(), flush=True)
