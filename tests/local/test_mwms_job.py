"""``distribution='tf-mwms'`` end to end here: one worker per simulated host with TF_CONFIG, real
FIFOs fed from a moto server over HTTP, real TensorFlow MultiWorkerMirroredStrategy collectives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sagemaker_dist import LocalBackend, LocalJobError, LocalJobFailed, run_local
from sagemaker_dist.local.demo import demo_estimator
from sagemaker_dist.local.demo_data import write_demo_data

SCRIPTS = Path(__file__).resolve().parents[1] / "helpers" / "local_scripts"


def _uneven_request(s3, bucket, hps, distribution="tf-mwms", **kwargs):
    """2 hosts; host 0's shard is 1 file of 32 records, host 1's is 5 (no counts anywhere)."""
    for name, files in (("one", 1), ("five", 5)):
        write_demo_data(
            f"s3://{bucket}/{name}/", files=files, records_per_file=32, validation_files=1, client=s3
        )
    estimator = demo_estimator(
        bucket,
        2,
        1,
        "Pipe",
        hps,
        source_dir=SCRIPTS,
        entry_point="mwms_steps.py",
        distribution=distribution,
        **kwargs,
    )
    inputs = {"train": [f"s3://{bucket}/one/train/", f"s3://{bucket}/five/train/"]}
    return estimator.prepare(inputs, printer=None, backend=LocalBackend()).request


def test_uneven_shards_without_counts_end_every_epoch_together(s3, bucket, tmp_path):
    """32 records against 160, batches of 8 per replica: every epoch runs 160 / 8 = 20 steps on both
    workers (the short one takes empty steps, tf.distribute's rule), nothing is dropped, exit 0."""
    request = _uneven_request(s3, bucket, {"epochs": 2, "batch_size": 8})
    assert request["HyperParameters"]["sagemaker_multi_worker_mirrored_strategy_enabled"] == "true"
    assert "sagemaker_mpi_enabled" not in request["HyperParameters"]
    lines = []
    result = run_local(request, SCRIPTS, work_dir=tmp_path, echo=lines.append, timeout=240)
    steps = sorted(re.findall(r"STEPS worker=(\d) epoch=(\d) steps=(\d+)", "\n".join(lines)))
    assert steps == [("0", "0", "20"), ("0", "1", "20"), ("1", "0", "20"), ("1", "1", "20")], lines[-40:]
    assert sum("DONE worker=" in line for line in lines) == 2
    fed = {(s.host, s.channel): s.records for s in result.feed_stats}
    assert fed["algo-1", "train_0"] == 64 and fed["algo-2", "train_1"] == 320  # 2 epochs, read to the end
    assert fed["algo-1", "train_1"] == fed["algo-2", "train_0"] == 0  # other workers' channels: unread
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("distribution", "helper", "expected"), [
    ("tf-mwms", "horovod", "call sagemaker_dist.runtime.tensorflow.mwms_keras.setup() instead"),
    ("horovod", "mwms", "call sagemaker_dist.runtime.tensorflow.horovod_keras.setup() instead"),
])  # fmt: skip
def test_a_script_calling_the_other_helper_fails_at_start_up(
    s3, bucket, tmp_path, distribution, helper, expected
):
    request = _uneven_request(s3, bucket, {"epochs": 1, "helper": helper}, distribution)
    with pytest.raises(LocalJobFailed) as failure:
        run_local(request, SCRIPTS, work_dir=tmp_path, echo=lambda _: None, timeout=120)
    assert expected in str(failure.value)
    assert f"this job was planned for distribution {distribution!r}" in str(failure.value)


def test_mpirun_is_refused_for_a_strategy_job(s3, bucket, tmp_path):
    request = _uneven_request(s3, bucket, {"epochs": 1})
    with pytest.raises(LocalJobError, match="launcher 'mpirun' is for Horovod jobs"):
        run_local(request, SCRIPTS, launcher="mpirun", work_dir=tmp_path, echo=lambda _: None)


def test_a_rerun_resumes_every_worker_from_the_chiefs_newest_checkpoint(s3, bucket, tmp_path):
    """Only the chief's checkpoints reach S3; a rerun restores them onto every host, and both workers
    start at the epoch after the newest."""
    checkpoint = f"s3://{bucket}/ckpt/mwms"
    first = _uneven_request(s3, bucket, {"epochs": 2}, checkpoint_s3_uri=checkpoint)
    run_local(first, SCRIPTS, work_dir=tmp_path, echo=lambda _: None, timeout=240)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/mwms/")["Contents"]
    metas = [o["Key"] for o in listed if o["Key"].endswith("meta.json")]
    assert metas == ["ckpt/mwms/epoch-00001/meta.json", "ckpt/mwms/epoch-00002/meta.json"]
    assert all('"rank": 0' in s3.get_object(Bucket=bucket, Key=k)["Body"].read().decode() for k in metas)
    lines = []
    rerun = _uneven_request(s3, bucket, {"epochs": 3}, checkpoint_s3_uri=checkpoint)
    run_local(rerun, SCRIPTS, work_dir=tmp_path, echo=lines.append, timeout=240)
    done = sorted(line.split("] ", 1)[1] for line in lines if "DONE worker=" in line)
    assert done == ["DONE worker=0 initial_epoch=2", "DONE worker=1 initial_epoch=2"], lines[-30:]
    assert sorted(re.findall(r"STEPS worker=(\d) epoch=(\d)", "\n".join(lines))) == [("0", "2"), ("1", "2")]
