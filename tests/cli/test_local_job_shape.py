"""``local`` and ``tune --local`` give a job the same hosts and processes per host by default, the
distribution's rule among them (its registry entry): a tf-mwms job has one worker per host, whatever
the launcher. ``tune --local --distribution tf-mwms --launcher toolkit`` without ``-P`` once asked for 2
processes per host, which the estimator refuses for tf-mwms, where ``local`` with the same options ran.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest

import sagemaker_dist.cli.local as cli_local
from sagemaker_dist.cli import main


class _Built(Exception):
    """Raised once the job's estimator is built: nothing runs."""


@pytest.fixture
def built(monkeypatch, tmp_path):
    """The (hosts, processes per host) of the estimator the command builds; no S3 and no job."""
    shapes = []
    real = cli_local.entry_point_estimator

    def capture(args, bucket, hosts, per_host, input_mode):
        est = real(args, bucket, hosts, per_host, input_mode)  # the estimator's own checks run
        shapes.append((est.instance_count, est.processes_per_host))
        raise _Built

    monkeypatch.setattr(cli_local, "entry_point_estimator", capture)
    monkeypatch.setattr(cli_local, "endpoint_for", lambda args: nullcontext(None))
    (tmp_path / "train.py").write_text("print('never run')\n")
    monkeypatch.chdir(tmp_path)
    return shapes


def _run(command: str, distribution: str, launcher: str) -> None:
    job = ["--entry-point", "train.py", "--train", "s3://bucket/data/", "--bucket", "bucket"]
    job += ["--distribution", distribution, "--launcher", launcher]
    if command == "tune":
        argv = ["tune", "--local", "--objective-metric", "val_loss", "--range", "learning_rate=1e-4:1e-2",
                "--max-jobs", "1", *job]  # fmt: skip
    else:
        argv = ["local", *job]
    with pytest.raises(_Built):
        main(argv)


@pytest.mark.parametrize(("distribution", "launcher", "shape"), [
    ("tf-mwms", "toolkit", (1, 1)),  # the drift: tune asked for 2 per host here
    ("tf-mwms", "container", (1, 1)),
    ("tf-mwms", "horovodrun", (2, 1)),
    ("horovod", "toolkit", (1, 2)),
    ("horovod", "horovodrun", (2, 1)),
])  # fmt: skip
@pytest.mark.parametrize("command", ["local", "tune"])
def test_local_and_tune_local_take_the_same_defaults(built, command, distribution, launcher, shape):
    _run(command, distribution, launcher)
    assert built == [shape]
