"""`sagemaker-dist plan` and `sagemaker-dist shard` against moto server via AWS_ENDPOINT_URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.s3_data import ODD_NAMES, all_keys, dataset, put_objects

from sagemaker_dist.cli import main
from sagemaker_dist.contract.layout import ChannelLayout
from sagemaker_dist.launch.shard_writer import read_shard_set

P3 = ["--instance-type", "ml.p3.8xlarge"]  # 4 GPUs per host


@pytest.fixture
def source(s3, bucket):
    put_objects(s3, bucket, dataset("data/", 40))
    return f"s3://{bucket}/data/"


def test_plan_without_a_prefix_shows_the_layout(aws_env, capsys):
    assert main(["plan", *P3, "--instance-count", "2", "--validation", "single", "--eval", "--json"]) == 0
    out = capsys.readouterr().out
    assert "2 host(s) x 4 process(es) = 8 Horovod rank(s); strategy per-rank; 10 of 20 channels" in out
    assert "channels: train_0, train_1" in out and "validation, eval" in out
    layout = ChannelLayout.from_json(out.split("sagemaker_dist_layout: ")[1].splitlines()[0])
    assert layout.world_size == 8 and layout.channel_for("train", 5, 1) == "train_5"


def test_plan_switches_to_per_local_rank_when_per_rank_does_not_fit(aws_env, capsys):
    args = ["plan", "--instance-type", "ml.p4d.24xlarge", "--instance-count", "4", "--shuffle-seed", "7"]
    assert main([*args, "--record-wrapper", "RecordIO"]) == 0
    out = capsys.readouterr().out
    assert "strategy per-local-rank; 8 of 20 channels" in out
    assert "by object count" in out
    assert "ShuffleConfig seed 7" in out and "RecordWrapperType RecordIO" in out


def test_plan_with_a_prefix_shows_the_shard_table(source, capsys):
    assert main(["plan", *P3, "--instance-count", "1", "--processes-per-host", "3", source]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    table = lines[lines.index(next(x for x in lines if x.split()[:2] == ["shard", "channel"])) + 2 :]
    rows = [line.split() for line in table if line.split()[0].isdigit()]
    assert [r[1] for r in rows] == ["train_0", "train_1", "train_2"]
    assert sum(int(r[2]) for r in rows) == 40 + len(ODD_NAMES)
    assert sum(float(r[-1].rstrip("%")) for r in rows) == pytest.approx(100, abs=0.02)
    assert "largest shard / lower bound" in out


def test_shard_dry_run_prints_the_table_and_writes_nothing(s3, bucket, source, capsys):
    before = all_keys(s3, bucket)
    argv = ["shard", source, f"s3://{bucket}/out/", *P3, "--instance-count", "2", "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("shard"))
    assert header.split() == ["shard", "channel", "objects", "bytes", "size", "share"]
    assert "train_7" in out and "dry run: nothing written" in out
    assert all_keys(s3, bucket) == before


def test_shard_writes_manifests_then_copies(s3, bucket, source, capsys):
    out_uri = f"s3://{bucket}/out"
    assert main(["shard", source, out_uri, *P3, "--instance-count", "1", "--suffix", ".tfrecord"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 4 manifests" in printed and f"complete: {out_uri}/train/_plan.json" in printed
    shard_set = read_shard_set(out_uri, client=s3)
    assert shard_set.s3_data_type == "ManifestFile"
    assert sum(shard_set.objects_per_shard) == 40 + len(ODD_NAMES)

    copy = ["shard", source, f"s3://{bucket}/copies/", *P3, "--instance-count", "1", "--mode", "copy"]
    assert main([*copy, "--no-progress"]) == 0
    assert f"copied {40 + len(ODD_NAMES)} objects, skipped 0" in capsys.readouterr().out
    assert main([*copy, "--no-progress"]) == 0
    assert f"copied 0 objects, skipped {40 + len(ODD_NAMES)}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--instance-type", "ml.p3.16xlarg", "--instance-count", "1"], "Did you mean ml.p3.16xlarge"),
        ([*P3, "--instance-count", "0"], "instance count is 0"),
        ([*P3, "--instance-count", "6", "--strategy", "per-rank"], "need 24 channels"),
        ([*P3, "--instance-count", "1", "--role", "train/data"], "characters SageMaker rejects"),
        ([*P3, "--instance-count", "1", "--extra-channel", "my code"], "characters SageMaker rejects"),
        ([*P3, "--instance-count", "1", "--processes-per-host", "0"], "must be a whole number >= 1"),
        ([*P3, "--instance-count", "1", "--processes-per-host", "5"], "ml.p3.8xlarge has 4 GPU"),
        (["--instance-type", "ml.c5.18xlarge", "--instance-count", "1"], "--processes-per-host N"),
    ],
)
def test_bad_cluster_arguments_fail_before_any_s3_call(s3, bucket, capsys, argv, message):
    # The source bucket does not exist: had S3 been called first, the error would name it instead.
    before = all_keys(s3, bucket)
    assert main(["shard", "s3://no-such-source/data/", f"s3://{bucket}/out/", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert all_keys(s3, bucket) == before


def test_over_the_cap_names_the_counts_and_the_layout_that_fits(aws_env, capsys):
    argv = ["plan", *P3, "--instance-count", "6", "--strategy", "per-rank", "--validation", "per-worker"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "per-rank: 48 channels; per-local-rank: 8 channels" in err
    assert "use strategy 'per-local-rank'" in err


@pytest.mark.parametrize(
    "source_uri, extra, message",
    [
        ("s3://no-such-source/data/", [], "bucket 'no-such-source' does not exist"),
        ("s3://{b}/nothing/", [], "no objects to shard under"),
        ("s3://{b}/data/", ["--suffix", ".parquet"], "end with '.parquet'"),
        ("s3://{b}/data/part-0000", [], "10 object(s) for 16 shard(s)"),
        ("data/", [], "not an S3 URI"),
    ],
)
def test_bad_data_fails_with_a_named_error_and_writes_nothing(
    s3, bucket, source, capsys, source_uri, extra, message
):
    before = all_keys(s3, bucket)
    argv = ["shard", source_uri.format(b=bucket), f"s3://{bucket}/out/", *P3, "--instance-count", "4", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert all_keys(s3, bucket) == before


def test_missing_output_bucket(s3, bucket, source, capsys):
    assert main(["shard", source, "s3://no-such-output/x/", *P3, "--instance-count", "1"]) == 2
    assert "bucket 'no-such-output' does not exist" in capsys.readouterr().err


def test_console_command_reaches_the_endpoint_from_the_environment(aws_env, s3, bucket, source):
    """A separate process: the endpoint comes only from AWS_ENDPOINT_URL in its environment."""
    env = {**os.environ, **aws_env}
    argv = [sys.executable, "-m", "sagemaker_dist.cli", "shard", source, f"s3://{bucket}/out/", *P3]
    argv += ["--instance-count", "1", "--no-progress"]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    marker = json.loads(s3.get_object(Bucket=bucket, Key="out/train/_plan.json")["Body"].read())
    assert marker["complete"] is True and len(marker["uris"]) == 4


@pytest.mark.parametrize("command", ["plan", "shard"])
def test_per_local_rank_shards_with_fewer_objects_than_hosts_are_refused(s3, bucket, source, capsys, command):
    # 10 objects into 4 shards of 2-3 objects, each split by count across 4 hosts: some host gets none.
    before = all_keys(s3, bucket)
    output = [f"s3://{bucket}/out/"] if command == "shard" else []
    argv = [command, f"s3://{bucket}/data/part-0000", *output]
    argv += [*P3, "--instance-count", "4", "--strategy", "per-local-rank"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 10 object(s) in 4 shard(s), each ShardedByS3Key across 4 hosts")
    assert "train_0 has 3" in err and "--strategy per-rank" in err and "at least 16 in all" in err
    assert all_keys(s3, bucket) == before
    # 49 objects: every shard holds at least 4, so each host gets some of each channel.
    argv[1] = source
    assert main(argv) == 0
    assert "by object count" in capsys.readouterr().out


def test_shard_output_inside_the_source_is_refused_before_any_s3_call(s3, bucket, capsys):
    before = all_keys(s3, bucket)
    argv = ["shard", "s3://no-such-source/data/", "s3://no-such-source/data/shards/", *P3]
    assert main([*argv, "--instance-count", "1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: output s3://no-such-source/data/shards/train/ overlaps the source")
    assert all_keys(s3, bucket) == before
