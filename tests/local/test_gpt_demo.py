"""The sharded-model demo, ``sagemaker-dist local --demo --distribution torchrun --model gpt``: a small GPT
under FSDP2 on token records, 2 simulated hosts x 2 torchrun ranks, each rank its own FIFO fed from S3.

One job runs through the command line to its end. The same job is then stopped as a spot interruption
stops it (SIGTERM to every rank, here once rank 0 printed a given loss line, so that the stop lands
inside training whatever the machine's load) and started again with its checkpoints restored from S3:
each host wrote its ranks' shards into its own checkpoint directory, and each host gets all of them
back. The resumed job must go on with the very losses, and end with the very model, of the job never
stopped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local.demo import prepare_demo_job
from sagemaker_dist.local.job import run_local
from sagemaker_dist.local.spot import Interruption

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(900)]

CLI = [sys.executable, "-m", "sagemaker_dist.cli"]
EPOCHS = 3
LOSS = re.compile(r"\[rank 0 algo-1\] epoch (\d+) step (\d+): loss ([\d.]+)")
STOP_AFTER = "epoch 2 step 4: loss"  # rank 0's line; the ranks stop a step or two later


def losses(text: str) -> dict[tuple[int, int], str]:
    return {(int(e), int(s)): value for e, s, value in LOSS.findall(text)}


def saved_model(work: Path) -> dict:
    (path,) = work.glob("*/hosts/algo-1/model/model.pt")
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory):
    """The README's command with --model gpt, to its end (the work dir kept for its model)."""
    base = tmp_path_factory.mktemp("gpt-demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # the embedded endpoint
    argv = [*CLI, "local", "--demo", "--distribution", "torchrun", "--model", "gpt", "--epochs", str(EPOCHS)]
    argv += [
        "--s3-state-dir",
        str(base / "s3"),
        "--work-dir",
        str(base / "work"),
        "--keep",
        "--timeout",
        "600",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=700, env=env)
    return done, base / "work"


class AtLine(Interruption):
    """A spot interruption (SIGTERM to every rank process) once rank 0 printed ``text``."""

    def __init__(self, text: str, echo):
        super().__init__(at=0.0, echo=echo)
        self.text, self.seen = text, threading.Event()

    def on_line(self, rank, line: str) -> None:
        if rank == 0 and self.text in line:
            self.seen.set()

    def _due(self, group) -> bool:
        while not self._cancel.is_set() and group.poll() is None:
            if self.seen.wait(0.1):
                return True
        return False


def test_the_sharded_demo_trains_4_ranks_on_2_hosts_and_ends_0(never_stopped):
    done, work = never_stopped
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "2 host(s) x 2 process(es) = 4 torchrun rank(s)" in out
    assert "token records" in out or "tokens-demo" in out
    seen = losses(out)
    assert sorted(seen) == [(e, s) for e in range(1, EPOCHS + 1) for s in (4, 8, 12, 16)], out[-3000:]
    first, last = float(seen[(1, 4)]), float(seen[(EPOCHS, 16)])
    assert first > 5.5 and last < first - 1.5  # it learns the token language (uniform guessing: 6.24)
    for host in ("algo-1", "algo-2"):  # each host holds its own ranks' shards of the last checkpoint
        (final,) = work.glob(f"*/hosts/{host}/checkpoints/epoch-{EPOCHS:05d}")
        shards = sorted(p.name for p in final.glob("*.distcp"))
        assert shards == (
            ["__0_0.distcp", "__1_0.distcp"] if host == "algo-1" else ["__2_0.distcp", "__3_0.distcp"]
        )
    assert len(saved_model(work)) > 0


def test_a_stopped_demo_resumes_from_s3_with_the_losses_and_model_of_one_never_stopped(
    never_stopped, s3, bucket, tmp_path
):
    done, work = never_stopped
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    job = prepare_demo_job(
        bucket, 2, 2, hyperparameters={"epochs": EPOCHS}, printer=None, distribution="torchrun", model="gpt"
    )
    lines: list[str] = []
    stop = AtLine(STOP_AFTER, lines.append)
    common = {"launcher": "torchrun", "timeout": 600, "echo": lines.append}
    try:
        run_local(job.request, job.source_dir, on_started=stop.arm, on_rank_line=stop.on_line, **common)
    finally:
        stop.cancel()
    first = "\n".join(lines)
    assert stop.signalled_at is not None, first[-4000:]
    stopped = re.search(
        r"stopped in epoch (\d+) after step (\d+) on every rank; checkpoint (epoch-[\w-]+)", first
    )
    assert stopped, first[-4000:]
    epoch, step, name = int(stopped.group(1)), int(stopped.group(2)), stopped.group(3)
    assert (epoch, name) == (2, f"epoch-00001-step-{step:06d}") and 4 < step < 16, first[-4000:]
    lines.clear()
    run_local(job.request, job.source_dir, work_dir=tmp_path, keep_work_dir=True, **common)
    second = "\n".join(lines)
    assert re.search(r"restored \d+ checkpoint file\(s\)", second), second[-4000:]
    assert f"resuming from checkpoint {name} in epoch {epoch} after step {step}" in second, second[-4000:]
    whole, before, after = losses(done.stdout), losses(first), losses(second)
    assert before == {k: v for k, v in whole.items() if k <= (epoch, step)}
    assert after and min(after) > (epoch, step)  # nothing trained twice
    assert after == {k: v for k, v in whole.items() if k > (epoch, step)}  # the same losses, to the digit
    model, again = saved_model(work), saved_model(tmp_path)
    assert sorted(model) == sorted(again)
    for key, tensor in model.items():
        assert torch.equal(tensor, again[key]), key


def test_the_gpt_demo_is_a_torchrun_demo_and_a_demo():
    with pytest.raises(
        ConfigurationError, match="--model gpt is a PyTorch FSDP2 demo.*--distribution torchrun"
    ):
        prepare_demo_job("unused", 2, 2, printer=None, distribution="horovod", model="gpt")
    done = subprocess.run(
        [*CLI, "local", "--entry-point", "train.py", "--model", "gpt"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--model chooses the demo's model: give it with --demo" in done.stdout + done.stderr


def test_token_records_are_fixed_size_runs_of_the_token_language():
    import numpy as np

    from sagemaker_dist.contract.record_formats import encode_tfrecord
    from sagemaker_dist.local.demo_data import TOKEN_BYTES, TOKEN_RECORD, successors, token_file

    body = token_file(5, seed=3)
    frame = len(encode_tfrecord(b"\0" * TOKEN_BYTES))
    assert len(body) == 5 * frame
    table = successors()
    for i in range(5):
        record = body[i * frame : (i + 1) * frame]
        assert record == encode_tfrecord(record[12:-4])  # one TFRecord frame holding the tokens
        tokens = np.frombuffer(record[12:-4], dtype="<u2")
        assert len(tokens) == TOKEN_RECORD
        assert all(int(b) in table[int(a)] for a, b in zip(tokens[:-1], tokens[1:]))
