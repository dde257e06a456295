"""Supervision of the worker processes a launcher of our own starts (tf-mwms's workers, torchrun per
simulated host), as torchrun supervises its ranks: wait for all; at the first failure stop the rest
(SIGTERM, a grace period, then SIGKILL) and say which failed in torchrun's own words."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable


def supervise_workers(
    procs: list[subprocess.Popen],
    relays: list[threading.Thread],
    grace_s: float,
    failed_name: Callable[[int, int], tuple[object, int]],
) -> int:
    """0 when every worker ends 0; else the first failure's code (a signal's as 128 + N), after
    ``failed_name(index, code)`` has named it (the process name and exit code printed). ``relays``
    copy each worker's output; a SIGTERM to this process is passed to every worker."""

    def stop_all() -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, lambda s, f: (stop_all(), sys.exit(128 + s)))
    while True:
        codes = [proc.poll() for proc in procs]
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None:
            relays[failed].join(2.0)  # its last words first
            stop_all()
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            for relay in relays:
                relay.join(1.0)
            code = codes[failed]
            name, shown = failed_name(failed, code)
            print(f"Worker failed.\nProcess name: {name}\nExit code: {shown}", flush=True)
            return code if code > 0 else 128 - code
        if all(code == 0 for code in codes):
            for relay in relays:
                relay.join(5.0)
            return 0
        time.sleep(0.05)
