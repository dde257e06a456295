"""The test process ends with the status pytest computed, once every report is out.

The suite's pytest process holds TensorFlow, PyTorch, Horovod with Open MPI, pyarrow (TensorFlow's
Keras imports pandas, which imports it) and our compiled readers, each with threads and bundled
runtimes of its own (OpenMP, oneDNN, protobuf, jemalloc, OpenBLAS). After the summary the interpreter
tears the modules down (TensorFlow objects' ``__del__`` then run against half-cleared modules:
"TypeError: 'NoneType' object is not subscriptable" from ``atomic_function.__del__``), and ``exit()``
runs every library's C++ static destructors while other threads still run. Threads alive at the end
of ``-m "not slow"`` (gdb ``thread apply all bt`` from ``pytest_sessionfinish``):

- ``tensorflow::data::model::Model::OptimizeLoop``, ``tensorflow::data::BackgroundWorker::WorkerLoop``
  (tf.data iterators that Keras fits keep), waking on timers;
- ``gloo::transport::tcp::Loop::run`` (``epoll_wait``, 10 ms timeout) and
  ``c10d::ProcessGroupGloo::runLoop`` in libtorch_cpu; torch's ``gomp_thread_start`` pool;
- ``horovod::common::BackgroundThreadLoop`` with Open MPI's and PMIx's libevent threads (an MPI-built
  Horovod cannot start again once MPI is finalized, so it stays up to the end);
- pyarrow's ``jemalloc_bg_thd``, NumPy's and SciPy's ``blas_thread_server``, TensorFlow's Eigen pool;
- Python daemon threads blocked in ``recv``, ``accept`` or the ``open`` of a FIFO.

A daemon thread inside PyTorch's C++ at interpreter exit kills the process every time ("terminate
called without an active exception", status 134; gdb: ``pybind11::gil_scoped_release`` ->
``PyEval_RestoreThread`` -> ``take_gil`` -> ``PyThread_exit_thread`` -> ``pthread_exit``'s forced
unwind -> ``std::terminate``); a thread inside a library whose statics are being destroyed can kill it
now and then (SIGSEGV, 139, after a summary that says every test passed).
Which threads are there, and where they are at that moment, changes with every test, so no single
join or import order rules it out.

So once pytest is done (``pytest_sessionfinish``: summary printed, junit-xml and cache written; every
other ``pytest_unconfigure`` run), this plugin runs the interpreter's atexit handlers itself
(Horovod's shutdown and ``MPI_Finalize``, pending ``weakref.finalize`` clean-ups, logging's flush, as
a normal exit does), flushes stdout and stderr, and ends the process with
``os._exit(session.exitstatus)``: the module teardown and the static destructors are skipped, and the
status is pytest's own (failures still fail, an interrupted run still exits 2).

Only where pytest is the program (``python -m pytest``, the ``pytest`` script); ``pytest.main()``
called from another program returns to it as usual. ``SAGEMAKER_DIST_TEST_NATURAL_EXIT=1`` keeps the
interpreter's own exit (``scripts/exit-check.sh --natural`` shows whether that still crashes).
"""

from __future__ import annotations

import atexit
import os
import sys

import pytest

NATURAL_EXIT_ENV = "SAGEMAKER_DIST_TEST_NATURAL_EXIT"

_finished: list = []  # the session, once pytest_sessionfinish ran for it


def _pytest_is_the_program() -> bool:
    """True in ``python -m pytest`` and in the ``pytest`` script; False where pytest.main() was called."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == "pytest.__main__":
        return True
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return program in ("pytest", "py.test")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    _finished[:] = [session]


def _flush(config) -> None:
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    streams = [getattr(terminal, "_tw", None), sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__]
    for stream in streams:
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head) or stream: nothing more to write there
            pass


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if not _finished or os.environ.get(NATURAL_EXIT_ENV, "").strip() not in ("", "0"):
        return
    if not _pytest_is_the_program():
        return
    # pytest_sessionfinish may still have changed it (pytest.exit(returncode=...) there): read it now
    status = int(_finished.pop().exitstatus)
    _flush(config)
    atexit._run_exitfuncs()  # what a normal exit runs before the teardown skipped here
    _flush(config)
    os._exit(status)
