"""Nothing from S3 lands outside the job's tree: hostile keys under a File-mode channel, in a manifest,
under a checkpoint prefix and in the embedded S3's state, against a real moto server over HTTP. Each
case is refused, naming the key, before any rank starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sagemaker_dist.aws.request_validation import RequestValidationError
from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.contract.paths import UnsafePathError
from sagemaker_dist.host.feeder import (
    ChannelSpec,
    FeedError,
    S3Item,
    channel_download_dir,
    resolve_objects,
)
from sagemaker_dist.host.lifecycle import download_channel
from sagemaker_dist.host.outputs import CheckpointSync
from sagemaker_dist.local.job import run_local

CLIMBING_KEY = "data/train/../../../../x"


def _files_under(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


@pytest.fixture
def job_dir(tmp_path):
    """A deep tree (so a climbing key stays inside tmp_path) and where a key climbing out would land."""
    dest = tmp_path / "a" / "b" / "c" / "input" / "data" / "train"
    return dest, tmp_path / "a" / "b" / "x"  # dest/../../../../x


def test_a_manifest_that_is_not_there_is_named_with_how_to_write_it(s3, bucket):
    spec = ChannelSpec("train_0", f"s3://{bucket}/jobs/j/shards/train/0.manifest", data_type="ManifestFile")
    with pytest.raises(FeedError) as caught:
        resolve_objects(spec, s3_client())
    message = str(caught.value)
    assert f"manifest s3://{bucket}/jobs/j/shards/train/0.manifest does not exist." in message
    assert "If the request came from `launch --dry-run`" in message and "sagemaker-dist shard" in message


# --- File-mode channels -------------------------------------------------------------------------


def test_a_climbing_key_under_a_file_channel_is_refused_when_listed(s3, bucket, job_dir):
    dest, escaped = job_dir
    s3.put_object(Bucket=bucket, Key="data/train/ok", Body=b"fine")
    s3.put_object(Bucket=bucket, Key=CLIMBING_KEY, Body=b"evil")
    spec = ChannelSpec("train", f"s3://{bucket}/data/train/", input_mode="File")
    with pytest.raises(FeedError) as caught:
        resolve_objects(spec, s3_client())
    message = str(caught.value)
    assert (
        f"channel 'train': object s3://{bucket}/{CLIMBING_KEY} would be downloaded as '../../../../x'"
        in message
    )
    assert "climbs out" in message and "rename the object" in message
    assert not escaped.exists() and not dest.exists()
    # Pipe mode only streams the object: the same key is a valid key there
    pipe = ChannelSpec("train", f"s3://{bucket}/data/train/", input_mode="Pipe")
    assert CLIMBING_KEY in [item.key for item in resolve_objects(pipe, s3_client())]


def test_the_download_itself_refuses_an_item_the_listing_did_not_check(s3, bucket, job_dir):
    """A key climbing out of the channel dir (dest/../../../../x) is refused by the download itself."""
    dest, escaped = job_dir
    s3.put_object(Bucket=bucket, Key=CLIMBING_KEY, Body=b"evil")
    spec = ChannelSpec("train", f"s3://{bucket}/data/train/", input_mode="File")
    item = S3Item(bucket, CLIMBING_KEY, 4, "../../../../x")
    with pytest.raises(
        FeedError, match=r"object s3://.*/data/train/\.\./\.\./\.\./\.\./x would be downloaded"
    ):
        download_channel(spec, [item], dest, s3_client(), 0, 1)
    assert not escaped.exists() and _files_under(dest) == []


def test_a_link_in_the_channel_dir_does_not_carry_a_download_out(s3, bucket, job_dir, tmp_path):
    dest, _ = job_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    dest.mkdir(parents=True)
    (dest / "sub").symlink_to(outside)
    s3.put_object(Bucket=bucket, Key="data/train/sub/x", Body=b"evil")
    spec = ChannelSpec("train", f"s3://{bucket}/data/train/", input_mode="File")
    items = resolve_objects(spec, s3_client())  # a plain key: the listing accepts it
    with pytest.raises(FeedError, match="'sub/x', which leads out of .* through a symbolic link"):
        download_channel(spec, items, dest, s3_client(), 0, 1)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("name", ["..", "."])
def test_a_file_channel_named_dot_or_dot_dot_is_refused(s3, bucket, name, tmp_path):
    """SageMaker's channel-name pattern allows them; as a File-mode directory '..' is /opt/ml/input,
    where a key 'config/hyperparameters.json' would replace the job's own config."""
    s3.put_object(Bucket=bucket, Key="data/config/hyperparameters.json", Body=b"{}")
    spec = ChannelSpec(name, f"s3://{bucket}/data/", input_mode="File")
    with pytest.raises(
        FeedError, match=rf"downloaded into /opt/ml/input/data/<its name>, and the name '{name}'"
    ):
        resolve_objects(spec, s3_client())
    with pytest.raises(FeedError, match="give the channel another name"):
        channel_download_dir(spec, tmp_path / "input" / "data")
    assert resolve_objects(ChannelSpec(name, f"s3://{bucket}/data/", input_mode="Pipe"), s3_client())


def _manifest(s3, bucket, entries) -> str:
    body = json.dumps([{"prefix": f"s3://{bucket}/data/"}, *entries])
    s3.put_object(Bucket=bucket, Key="train.manifest", Body=body.encode())
    return f"s3://{bucket}/train.manifest"


@pytest.mark.parametrize(
    ("entry", "problem"),
    [("/etc/x", "is an absolute path"), ("../../x", "climbs out of its directory with '..'")],
)
def test_a_manifest_entry_that_escapes_is_refused_in_file_mode(s3, bucket, entry, problem):
    uri = _manifest(s3, bucket, ["ok", entry])
    spec = ChannelSpec("train", uri, data_type="ManifestFile", input_mode="File")
    with pytest.raises(FeedError) as caught:
        resolve_objects(spec, s3_client())
    assert f"channel 'train': manifest {uri} has the entry {entry!r}, which {problem}" in str(caught.value)
    assert "relative to it" in str(caught.value)
    pipe = ChannelSpec("train", uri, data_type="ManifestFile", input_mode="Pipe")
    assert resolve_objects(pipe, s3_client())[1].key == f"data/{entry}"  # streamed as the key it names


@pytest.mark.parametrize("mode", ["File", "Pipe"])
@pytest.mark.parametrize("entry", [5, {"key": "a"}, None])
def test_a_manifest_entry_that_is_not_a_string_is_a_clear_error(s3, bucket, mode, entry):
    """A non-string entry is an error naming the manifest and the entry, in any mode (not a TypeError)."""
    uri = _manifest(s3, bucket, ["ok", entry])
    spec = ChannelSpec("train", uri, data_type="ManifestFile", input_mode=mode)
    with pytest.raises(FeedError, match=rf"manifest {uri} has the entry .*, which is not a string"):
        resolve_objects(spec, s3_client())


# --- checkpoints --------------------------------------------------------------------------------


def test_a_climbing_key_under_the_checkpoint_prefix_is_refused_before_any_download(s3, bucket, tmp_path):
    ckpt = tmp_path / "a" / "b" / "hosts" / "algo-1" / "checkpoints"
    s3.put_object(Bucket=bucket, Key="ckpt/+first", Body=b"fine")  # lists before the hostile key
    s3.put_object(Bucket=bucket, Key="ckpt/../../x", Body=b"evil")
    with CheckpointSync(f"s3://{bucket}/ckpt", [ckpt], s3_client()) as sync:
        with pytest.raises(UnsafePathError) as caught:
            sync.restore()
    message = str(caught.value)
    assert f"checkpoint prefix s3://{bucket}/ckpt: object s3://{bucket}/ckpt/../../x" in message
    assert "climbs out" in message and "remove that object from the checkpoint prefix" in message
    assert _files_under(tmp_path) == []  # neither the hostile file nor the one before it


def test_restore_writes_plain_files_and_a_link_in_the_checkpoint_dir_is_no_way_out(s3, bucket, tmp_path):
    ckpt, outside = tmp_path / "ckpt", tmp_path / "outside"
    ckpt.mkdir()
    outside.mkdir()
    s3.put_object(Bucket=bucket, Key="ckpt/step-1/weights", Body=b"w")
    with CheckpointSync(f"s3://{bucket}/ckpt", [ckpt], s3_client()) as sync:
        assert sync.restore() == 1
    weights = ckpt / "step-1" / "weights"
    assert weights.read_bytes() == b"w" and not weights.is_symlink()
    assert _files_under(ckpt) == ["step-1/weights"]  # no temporary file left
    (ckpt / "old").symlink_to(outside)  # left by an earlier run in a persistent node root
    s3.put_object(Bucket=bucket, Key="ckpt/old/x", Body=b"evil")
    with CheckpointSync(f"s3://{bucket}/ckpt", [ckpt], s3_client()) as sync:
        with pytest.raises(UnsafePathError, match="'old/x', which leads out of .* through a symbolic link"):
            sync.restore()
    assert list(outside.iterdir()) == []


def test_checkpoint_upload_does_not_follow_a_linked_folder_out_of_the_dir(s3, bucket, tmp_path):
    """The sync walks the dir without entering linked folders: a link to elsewhere (the job's own
    doing; restore never makes one) does not carry that folder's files to S3."""
    ckpt, outside = tmp_path / "ckpt", tmp_path / "outside"
    ckpt.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("not a checkpoint")
    (ckpt / "weights").write_bytes(b"w")
    (ckpt / "elsewhere").symlink_to(outside)
    with CheckpointSync(f"s3://{bucket}/ckpt", [ckpt], s3_client()):
        pass  # uploads once on the way out
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == ["ckpt/weights"]


# --- the embedded S3's state dir ----------------------------------------------------------------
# Each endpoint runs in a process of its own, as the CLI runs it: moto's servers in one process share
# one backend, and an endpoint here would save every bucket this test session has made.

EMBEDDED = """
import sys
from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.local.endpoint import embedded_s3
state, bucket = sys.argv[1], sys.argv[2]
with embedded_s3(state) as url:
    client = s3_client(endpoint_url=url)
    known = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
    if bucket not in known:
        client.create_bucket(Bucket=bucket)
"""


def _embedded(state: Path, bucket: str, body: str) -> str:
    """Run ``body`` (with ``client`` and ``bucket``) against an embedded endpoint over ``state`` in a
    fresh process; its output (the endpoint's warnings), after checking it ended 0."""
    code = EMBEDDED + "".join(f"    {line}\n" for line in body.strip().splitlines())
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(state), bucket], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_hostile_keys_in_the_embedded_s3_are_left_out_of_its_state(bucket, tmp_path):
    state = tmp_path / "cache" / "local-s3"
    absolute = f"/{tmp_path.name}-abs/path"  # a naive join would write it at that absolute path
    hostile = [absolute, "../..", "../../x"]  # and these to cache/ and next to it
    keys = ["a/ok", *hostile]
    try:
        put = "client.put_object(Bucket=bucket, Key=key, Body=b'fine' if key == 'a/ok' else b'evil')"
        out = _embedded(state, bucket, f"for key in {keys!r}:\n    {put}")
        assert not os.path.exists(absolute)
    finally:
        if os.path.exists(absolute):
            os.unlink(absolute)
            os.rmdir(os.path.dirname(absolute))
    assert _files_under(state / bucket) == ["a/ok"]
    assert [f for f in _files_under(tmp_path) if not f.startswith("cache/local-s3/")] == [
        "cache/local-s3.lock"
    ]
    for key in hostile:
        assert f"warning: the embedded S3 state: bucket {bucket!r} has the key {key!r}, which " in out
    # the rest was saved, and loads again in the next process
    _embedded(state, bucket, "assert client.get_object(Bucket=bucket, Key='a/ok')['Body'].read() == b'fine'")


def test_a_crash_between_the_two_renames_of_a_save_leaves_the_previous_state(bucket, tmp_path):
    """The on-disk state a crash after 'state -> state.old' and before 'new -> state' leaves: the next
    command loads the previous state whole (and no temporary dir is left over)."""
    state = tmp_path / "local-s3"
    _embedded(state, bucket, "client.put_object(Bucket=bucket, Key='a/ok', Body=b'fine')")
    state.rename(tmp_path / "local-s3.old")
    half = tmp_path / ".local-s3.saving-crashed" / bucket
    half.mkdir(parents=True)
    (half / "half").write_bytes(b"half a state")
    _embedded(
        state,
        bucket,
        "assert [o['Key'] for o in client.list_objects_v2(Bucket=bucket)['Contents']] == ['a/ok']",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local-s3", "local-s3.lock"]
    assert _files_under(state / bucket) == ["a/ok"]


def test_a_save_that_fails_keeps_the_previous_state_whole(bucket, tmp_path):
    state = tmp_path / "local-s3"
    _embedded(state, bucket, "client.put_object(Bucket=bucket, Key='a', Body=b'first')")
    # a file and a folder at once: cannot be saved
    out = _embedded(state, bucket, "client.put_object(Bucket=bucket, Key='a/b', Body=b'second')")
    assert "warning: could not save the embedded S3 state" in out
    assert _files_under(state / bucket) == ["a"] and (state / bucket / "a").read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local-s3", "local-s3.lock"]


# --- whole jobs: refused before any rank starts -------------------------------------------------


def _file_mode_request(bucket: str, **extra) -> dict:
    return {
        "TrainingJobName": "hostile-keys",
        "RoleArn": "arn:aws:iam::000000000000:role/r",
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceCount": 1, "InstanceType": "ml.c5.xlarge"},
        "HyperParameters": {"sagemaker_program": json.dumps("train.py")},
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {
                    "S3DataSource": {"S3Uri": f"s3://{bucket}/data/train/", "S3DataType": "S3Prefix"}
                },
            }
        ],
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/out"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        **extra,
    }


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    marker = tmp_path / "rank-ran"
    (src / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    return src, marker


def test_the_local_command_refuses_a_hostile_key_before_any_rank_starts(
    aws_env, s3, bucket, tmp_path, source
):
    src, marker = source
    s3.put_object(Bucket=bucket, Key="data/train/ok", Body=b"fine")
    s3.put_object(Bucket=bucket, Key=CLIMBING_KEY, Body=b"evil")
    request = tmp_path / "request.json"
    request.write_text(json.dumps(_file_mode_request(bucket)))
    work = tmp_path / "work"
    command = Path(sys.executable).with_name("sagemaker-dist")
    argv = [str(command), "local", "--request", str(request), "--source-dir", str(src)]
    argv += ["--endpoint-url", aws_env["AWS_ENDPOINT_URL"], "--work-dir", str(work)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert f"channel 'train': object s3://{bucket}/{CLIMBING_KEY} would be downloaded as" in error
    assert not marker.exists() and _files_under(work) == []


def test_a_checkpoint_local_path_that_climbs_out_is_refused_before_anything_starts(
    aws_env, bucket, tmp_path, source
):
    src, marker = source
    request = _file_mode_request(
        bucket, CheckpointConfig={"S3Uri": f"s3://{bucket}/ckpt", "LocalPath": "/opt/ml/../../x"}
    )
    with pytest.raises(
        RequestValidationError, match=r"CheckpointConfig.LocalPath '/opt/ml/\.\./\.\./x' maps to"
    ):
        run_local(request, src, work_dir=tmp_path / "work")
    assert not marker.exists() and not (tmp_path / "work").exists()


def test_the_pipe_agent_refuses_a_hostile_manifest_entry_before_it_writes_the_node_tree(s3, bucket, tmp_path):
    from sagemaker_dist.host.job_spec import plan_node
    from sagemaker_dist.local.demo import prepare_demo_job
    from sagemaker_dist.platforms.pipe_agent import AgentS3AccessError, run_agent

    request = prepare_demo_job(bucket, 2, 1, printer=None).request
    (channel,) = [c for c in request["InputDataConfig"] if c["ChannelName"] == "train_0"]
    channel["InputMode"] = "File"
    uri = _manifest(s3, bucket, ["ok", "../../x"])
    channel["DataSource"]["S3DataSource"]["S3Uri"] = uri
    root = tmp_path / "a" / "b" / "node"
    with pytest.raises(
        AgentS3AccessError, match=rf"node 0: channel 'train_0': manifest {uri} has the entry '\.\./\.\./x'"
    ):
        run_agent(plan_node(request, 0), root, s3_client())
    assert not (tmp_path / "a").exists()
