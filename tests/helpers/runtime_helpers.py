"""Test helpers for the container runtime: a fake /opt/ml tree and a SageMaker-like FIFO feeder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, ChannelLayout


def write_opt_ml(
    root: Path,
    channels: dict[str, str] | list[str],
    layout: ChannelLayout | None = None,
    hyperparameters: dict | None = None,
    hosts: tuple[str, ...] = ("algo-1",),
    wrapper: str = "None",
) -> Path:
    """Write <root>/input/config/*.json as SageMaker does (hyperparameter values as strings)."""
    if isinstance(channels, list):
        channels = {name: "Pipe" for name in channels}
    config = root / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    (root / "input" / "data").mkdir(parents=True, exist_ok=True)
    data_config = {
        name: {
            "TrainingInputMode": mode,
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": wrapper,
        }
        for name, mode in channels.items()
    }
    hps = {k: json.dumps(v) for k, v in (hyperparameters or {}).items()}
    if layout is not None:
        hps[LAYOUT_HYPERPARAMETER] = layout.to_json()
    resource = {"current_host": hosts[0], "hosts": list(hosts), "network_interface_name": "eth0"}
    (config / "inputdataconfig.json").write_text(json.dumps(data_config))
    (config / "hyperparameters.json").write_text(json.dumps(hps))
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    return root


class FifoFeeder(threading.Thread):
    """Plays SageMaker's part for one channel: creates <channel>_<n>, writes epoch n, closes, repeats.

    Like SageMaker, the next FIFO appears only after the previous one was closed by the writer.
    """

    def __init__(
        self, data_dir: Path, channel: str, epochs: list[bytes], pace: tuple[int, float] | None = None
    ):
        super().__init__(daemon=True)
        self.data_dir = Path(data_dir)
        self.channel = channel
        self.epochs = epochs
        self.pace = pace  # (bytes, seconds): a writer slower than the reader, a pause after each piece
        self.served = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for n, payload in enumerate(self.epochs):
                path = self.data_dir / f"{self.channel}_{n}"
                os.mkfifo(path)
                with open(path, "wb") as f:  # blocks until the reader opens its end
                    try:
                        step = self.pace[0] if self.pace else len(payload) or 1
                        for at in range(0, len(payload), step):
                            f.write(payload[at : at + step])
                            if self.pace:
                                f.flush()
                                time.sleep(self.pace[1])
                    except BrokenPipeError:  # reader closed early: fine, as with SageMaker
                        pass
                self.served += 1
        except BaseException as exc:  # surfaced by the test through .error
            self.error = exc

    def wait_served(self, count: int, timeout: float = 10.0) -> int:
        """``served`` once it reaches ``count`` (the writer counts a FIFO after the reader closed it),
        or whatever it is after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.served < count and self.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.served


SHORT_WRITES = """
import os, sys
out = os.open(sys.argv[1], os.O_WRONLY)
data = open(sys.argv[2], "rb").read()
for i in range(0, len(data), 7000):  # small writes: the reader sees short reads
    os.write(out, data[i : i + 7000])
os.close(out)
"""


def write_in_short_writes(fifo: Path, src: Path) -> subprocess.Popen:
    """A writer process sending ``src``'s bytes into ``fifo`` in 7000-byte writes, as a slow feed does."""
    return subprocess.Popen([sys.executable, "-c", SHORT_WRITES, str(fifo), str(src)])


def terminal_sigint() -> None:
    """A ``preexec_fn`` giving a command SIGINT's default handler, as from a terminal: a test run started in
    the background (nohup, `&`) ignores SIGINT, and Python keeps an inherited SIG_IGN, so the command
    would never see a Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
