"""``sagemaker-dist local --demo --distribution torchrun`` through the command line: real ``torchrun``
once per simulated host, real Gloo ranks, each reading its own FIFO fed from the embedded S3 endpoint;
one epoch of the small demo data. Under our launcher 2 hosts x 1 rank, in Pipe and File mode; under
``--launcher toolkit`` 2 hosts x 2 ranks, AWS's toolkit (sagemaker-pytorch-training on sagemaker-
training 4.8.3, the PyTorch DLC's entry point) running ``torchrun`` on each host itself."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sagemaker_dist.local.demo import DEMO_FILES, DEMO_RECORDS_PER_FILE
from sagemaker_dist.local.launchers import TORCHRUN
from sagemaker_dist.local.launchers import torchrun as launcher
from sagemaker_dist.local.launchers.table import launcher_class
from sagemaker_dist.local.rank_entry import world_rank

HAVE_TORCH = importlib.util.find_spec("torch") is not None

CLI = [sys.executable, "-m", "sagemaker_dist.cli"]
SUMMARY_ROW = re.compile(r"^\s+(\d+)\s+(algo-\d+)\s+(train_\d+)\s+([\d,]+|\?)\s", re.MULTILINE)
DATA_FILES = max(DEMO_FILES, 4 * 4)  # what local mode writes for 4 ranks (4 files a rank at least)
TRAINED = re.compile(r"\] rank (\d+): trained (\d+) record\(s\)")
METRICS = re.compile(
    r"sagemaker-dist-metrics: epoch=1 accuracy=[\d.]+ loss=[\d.]+ val_accuracy=[\d.]+ val_loss=[\d.]+"
)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    """The embedded endpoint's buckets, shared by the module's jobs: the demo data written once, as large
    as the largest job (4 ranks) would write it, so that every job reads the same dataset."""
    state = tmp_path_factory.mktemp("local-s3")
    written = subprocess.run(
        [*CLI, "demo-data", "--s3-state-dir", str(state), "--files", str(DATA_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert written.returncode == 0, written.stdout + written.stderr
    return state


def _env(**more: str) -> dict[str, str]:
    """This environment without AWS_* (the jobs use the embedded endpoint), plus ``more``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **more}


def _demo(state_dir: Path, launcher: str, hosts: int, per_host: int, work_dir: Path, *more: str, temp=None):
    argv = [
        *CLI,
        "local",
        "--demo",
        "--distribution",
        "torchrun",
        "--epochs",
        "1",
        "--launcher",
        launcher,
        *more,
    ]
    argv += ["--hosts", str(hosts), "--processes-per-host", str(per_host)]
    argv += ["--s3-state-dir", str(state_dir), "--work-dir", str(work_dir), "--timeout", "240"]
    env = _env(TMPDIR=str(temp)) if temp else _env()
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)


def test_local_mode_starts_our_torchrun_launcher_which_starts_torchrun_once_per_host(tmp_path):
    python = str(tmp_path / "bin" / "python")
    assert launcher_class(TORCHRUN).rank_command(4, python) == [
        *(python, "-u", "-m", "sagemaker_dist.local.launchers.torchrun", "--python", python, "--"),
        *(python, "-u", "-m", "sagemaker_dist.local.rank_entry"),
    ]
    assert launcher.host_command(python, 2, 1, 3, 4242, ["rank"]) == [
        *(python, "-m", "torch.distributed.run"),  # no torchrun beside this Python
        *("--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "3"),
        *("--master_addr", "127.0.0.1", "--master_port", "4242", "--tee", "3", "--no-python", "rank"),
    ]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "torchrun").write_text("")
    assert launcher.host_command(python, 1, 0, 1, 1, [])[0] == str(tmp_path / "bin" / "torchrun")


def test_the_relay_tags_each_line_with_its_world_rank_and_notes_the_rank_torchrun_blames(capsys):
    class Proc:
        stdout = iter([
            "[default0]:hello\n",
            "[default2]:[W socket.cpp] x\n",
            "W1126 torch/distributed/run.py] OMP_NUM_THREADS\n",
            "  rank      : 7 (local_rank: 1)\n",
            "  exitcode  : 3 (pid: 12)\n",
        ])  # fmt: skip

    host = launcher._Host("algo-3", 6, Proc())
    launcher._relay(host, threading.Lock())
    assert capsys.readouterr().out.splitlines()[:3] == [
        "[6]<stdout>:hello",
        "[8]<stdout>:[W socket.cpp] x",
        "algo-3: W1126 torch/distributed/run.py] OMP_NUM_THREADS",
    ]
    assert (host.failure.rank, host.failure.code) == (7, 3)


def test_a_rank_learns_its_place_from_torchrun_variables(monkeypatch):
    for name in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("RANK", "3"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    assert world_rank() == (3, 4)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the torch extra)")
@pytest.mark.parametrize(
    ("launcher", "hosts", "per_host", "mode"),
    [  # our launcher with 2 ranks a host: the spot test's 2 x 2 (test_local_spot.py)
        ("torchrun", 2, 1, "Pipe"),
        ("toolkit", 2, 2, "Pipe"),
        ("torchrun", 2, 1, "File"),
    ],
)
def test_the_demo_trains_with_torchrun_each_rank_reading_its_own_fifo(
    state_dir, tmp_path, tmp_path_factory, launcher, hosts, per_host, mode
):
    """In File mode each rank reads its channel's downloaded files (PipeBatches reads either mode)."""
    # the job's $TMPDIR, where torchrun would make its own folders if the launcher gave it none (a
    # folder of this test's own: the suite's other tests start torchrun too)
    temp = tmp_path_factory.mktemp("job-tmpdir")
    done = _demo(state_dir, launcher, hosts, per_host, tmp_path, "--input-mode", mode, temp=temp)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    for node_rank in range(hosts):
        if launcher == "toolkit":  # the toolkit's own command, as in the PyTorch DLC
            shown = (
                f"torchrun --nnodes {hosts} --nproc_per_node {per_host} --master_addr algo-1 "
                f"--master_port 7777 --node_rank {node_rank} train_torch.py --batch_size 32 --epochs 1"
            )
            assert f"algo-{node_rank + 1}: {shown}" in out, out[-4000:]
        else:
            assert f"torchrun --nnodes {hosts} --node_rank {node_rank} --nproc_per_node {per_host}" in out
    rows = {int(rank): (host, channel, records) for rank, host, channel, records in SUMMARY_ROW.findall(out)}
    world = hosts * per_host
    # File mode on several hosts: a channel per local rank, ShardedByS3Key (each host downloads its share)
    index = (lambda rank: rank % per_host) if mode == "File" and hosts > 1 else (lambda rank: rank)
    assert {rank: (host, channel) for rank, (host, channel, _) in rows.items()} == {
        rank: (f"algo-{rank // per_host + 1}", f"train_{index(rank)}") for rank in range(world)
    }, out[-3000:]
    assert f"x {per_host} process(es), {mode} mode" in out
    trained = {int(rank): int(n) for rank, n in TRAINED.findall(out)}
    # each rank read its own channel to the end, and the channels held the whole dataset (4 files per
    # rank at least); in Pipe mode what it trained is what was streamed into its FIFO
    assert sum(trained.values()) == DATA_FILES * DEMO_RECORDS_PER_FILE, out[-3000:]
    for rank, (host, _, records) in rows.items():
        assert f"[rank {rank} {host}] rank {rank}: trained {trained[rank]} record(s)" in out, out[-3000:]
        assert records == (f"{trained[rank]:,}" if mode == "Pipe" else "?")
    assert len(METRICS.findall(out)) == 1, out[-3000:]  # rank 0's metric line, one epoch
    assert "model: s3://sagemaker-dist-demo/jobs/" in out
    assert not list(tmp_path.iterdir())  # the job's work dir is gone
    if launcher == "torchrun":  # torchrun's own folders went with it, not left in the temporary dir
        assert not list(temp.glob("torchelastic_*")), list(temp.iterdir())
    assert "ignoring arguments" not in out, out[-3000:]  # the script takes every hyperparameter it gets
    # c10d's lookup of the loopback is answered in the job's network namespace (no DNS there)
    assert "The hostname of the client socket cannot be retrieved" not in out, out[-3000:]


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the torch extra)")
def test_the_torch_demo_script_takes_every_hyperparameter_the_demo_gives_it(s3, bucket, caplog):
    """The torch demo is run with the demo's hyperparameters (tensorboard_interval included) and uses
    each: none is logged as ignored, and PipeTraining syncs TensorBoard at the demo's interval."""
    import importlib.util as util

    from sagemaker_dist.contract.distributions import TORCHRUN_ENTRY
    from sagemaker_dist.contract.toolkit import container_argv
    from sagemaker_dist.local.demo import DEMO_JOB_DIR, prepare_demo_job

    request = prepare_demo_job(bucket, 2, 1, printer=None, distribution=TORCHRUN_ENTRY.name).request
    argv = container_argv(request["HyperParameters"])
    assert "--tensorboard_interval" in argv and "--tensorboard_s3_uri" in argv, argv
    spec = util.spec_from_file_location("demo_train_torch", DEMO_JOB_DIR / TORCHRUN_ENTRY.demo_script)
    script = util.module_from_spec(spec)
    spec.loader.exec_module(script)
    caplog.clear()
    with caplog.at_level("INFO"):
        args = script.parse_args(argv)
    ignored = [r.getMessage() for r in caplog.records if "ignoring arguments" in r.getMessage()]
    assert not ignored, ignored
    assert args.tensorboard_interval == 5.0 and args.epochs == 2 and args.batch_size == 32


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_the_launcher_names_the_loopback_c10d_looks_up_in_a_namespace_without_dns(tmp_path):
    """In a network namespace of its own (no DNS server) the reverse lookup of ::ffff:127.0.0.1 that
    c10d's client makes fails; the launcher's processes get an /etc/hosts that answers it, in a mount
    namespace of their own (this machine's /etc/hosts untouched)."""
    before = Path("/etc/hosts").read_text()
    probe = (
        "import socket, sys\n"
        "from pathlib import Path\n"
        "from sagemaker_dist.local.launchers import torchrun\n"
        "assert torchrun.loopback_unnamed()\n"
        "assert torchrun.name_the_loopback(Path(sys.argv[1]))\n"
        "print(socket.getnameinfo((torchrun.LOOPBACK_V4_MAPPED, 0), socket.NI_NUMERICSERV)[0])\n"
    )
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", probe, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "localhost", done.stdout + done.stderr
    assert Path("/etc/hosts").read_text() == before


FAILING_SCRIPT = """
from sagemaker_dist.runtime import PipeBatches, ddp_main, setup_ddp


@ddp_main
def main():
    job = setup_ddp()
    if job.rank == RANK:
        raise ValueError("boom at rank RANK")
    for _ in PipeBatches(job, 8):
        pass
    job.close()


main()
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the torch extra)")
@pytest.mark.parametrize(
    ("launcher", "hosts", "per_host", "failing"), [("torchrun", 2, 1, 1), ("toolkit", 2, 2, 3)]
)
def test_a_rank_that_raises_is_named_with_its_traceback(
    state_dir, tmp_path, launcher, hosts, per_host, failing
):
    """On the toolkit, rank 3's host also stopped rank 2 (SIGTERM): torchrun's root cause is named."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "fail.py").write_text(FAILING_SCRIPT.replace("RANK", str(failing)))
    argv = [
        *CLI,
        "local",
        "--entry-point",
        "fail.py",
        "--source-dir",
        str(source),
        "--distribution",
        "torchrun",
    ]
    argv += ["--launcher", launcher, "--hosts", str(hosts), "--processes-per-host", str(per_host)]
    argv += ["--train", "s3://sagemaker-dist-demo/cifar10-demo/train/", "--s3-state-dir", str(state_dir)]
    done = subprocess.run(
        argv + ["--timeout", "120"], capture_output=True, text=True, timeout=200, env=_env()
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    named = f"rank {failing} (host algo-2) exited with code 1; the other ranks were stopped"
    assert named in out, out[-3000:]
    assert f"ValueError: boom at rank {failing}" in out[out.index(named) :]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (pip install .[torch])")
def test_a_first_day_own_script_on_a_local_folder_of_records_written_without_tensorflow(tmp_path):
    """The PyTorch first day: records written with the public writers (no TensorFlow), a local folder
    given as --train (mirrored into the embedded S3), one's own script under torchrun, 2 ranks: every
    record trained once. A rerun after files are deleted trains without them (no stale objects)."""
    import json

    from sagemaker_dist import encode_example, write_tfrecords

    data = tmp_path / "my data"
    data.mkdir()
    for f in range(6):
        ids = range(f * 8, f * 8 + 8)
        write_tfrecords(
            data / f"part-{f}.tfrecord", [encode_example({"id": i, "label": i % 10}) for i in ids]
        )
    scripts = Path(__file__).resolve().parents[1] / "helpers" / "local_scripts"

    def run(out: Path) -> list[int]:
        out.mkdir()
        argv = [*CLI, "local", "--entry-point", "train_ids_torch.py", "--source-dir", str(scripts)]
        argv += ["--train", str(data), "--distribution", "torchrun", "--hosts", "1", "--processes-per-host"]
        argv += [
            "2",
            "--epochs",
            "1",
            "-p",
            f"out={out}",
            "-p",
            "pause=0",
            "--s3-state-dir",
            str(tmp_path / "s3"),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_env())
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"--train: {len(list(data.iterdir()))} file(s) of {data}" in done.stdout
        assert "Setting OMP_NUM_THREADS" not in done.stdout + done.stderr  # torchrun's banner: nothing to do
        return sorted(
            i
            for path in out.glob("trained-rank*.jsonl")
            for line in path.read_text().splitlines()
            for i in json.loads(line).get("ids", [])
        )

    assert run(tmp_path / "first") == list(range(48))
    (data / "part-4.tfrecord").unlink()
    (data / "part-5.tfrecord").unlink()
    assert run(tmp_path / "second") == list(range(32))
