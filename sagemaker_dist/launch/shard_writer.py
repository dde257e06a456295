"""Write a ShardPlan to S3: one ManifestFile per shard (zero copy) or server-side copies per shard.

Output under ``<out>/<role>/``:

- manifest mode: ``<k>.manifest`` (SageMaker's ManifestFile format) for each shard ``k``;
- copy mode: ``<k>/<key relative to the source folder>`` (the layout of AWS's Horovod Pipe-mode
  post), copied server-side with boto3's managed transfer (multipart above a threshold).

``_plan.json`` (``COMPLETE_MARKER``) is deleted first and written last, after every manifest or copy
succeeded, so an interrupted run never looks complete; read it back with ``read_shard_set``.
Copy mode is idempotent: a destination object with the source's size is skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace

from sagemaker_dist.aws.progress import progress_bar
from sagemaker_dist.aws.s3_objects import (
    S3AccessError,
    describe_client_error,
    make_client,
    unreachable,
)
from sagemaker_dist.contract.layout import check_channel_name
from sagemaker_dist.contract.s3_uri import parse_s3_uri, s3_uri
from sagemaker_dist.errors import AwsError, ConfigurationError, DataError
from sagemaker_dist.launch.sharding import ShardPlan

MANIFEST = "manifest"
COPY = "copy"
MODES = (MANIFEST, COPY)
S3_DATA_TYPES = {MANIFEST: "ManifestFile", COPY: "S3Prefix"}
COMPLETE_MARKER = "_plan.json"
MARKER_VERSION = 1
MiB = 1024 * 1024


class ShardPlanError(ConfigurationError):
    """A shard-writing request that cannot work (mode, names, output inside the source); nothing written."""


class ShardWriteError(AwsError):
    """Shards that could not be written; nothing was marked complete."""


class IncompleteShardsError(DataError):
    """An output prefix without a complete shard set (never written, or interrupted)."""


@dataclass(frozen=True)
class ShardSet:
    """Where each shard of one role lives: ``uris[i]`` is the S3 source of channel ``{role}_{i}``."""

    role: str
    mode: str
    s3_data_type: str  # 'ManifestFile' or 'S3Prefix'
    uris: list[str]
    source_uri: str
    output_uri: str
    objects_per_shard: list[int]
    bytes_per_shard: list[int]
    # What this run did (not part of the recorded set, so not compared):
    copied: int = field(default=0, compare=False)  # objects copied (copy mode)
    skipped: int = field(default=0, compare=False)  # objects already there with the same size
    deleted: int = field(default=0, compare=False)  # stale objects of an earlier plan removed
    plan_uri: str = field(default="", compare=False)

    @property
    def channel_names(self) -> list[str]:
        return [f"{self.role}_{i}" for i in range(len(self.uris))]

    def to_json(self) -> str:
        doc = {"version": MARKER_VERSION, "complete": True, **asdict(self)}
        for run_only in ("copied", "skipped", "deleted", "plan_uri"):
            doc.pop(run_only)
        return json.dumps(doc, indent=1, sort_keys=True)


def _folder(key_prefix: str) -> str:
    """The 'folder' part of a key prefix: ``data/part-`` -> ``data/``."""
    return key_prefix[: key_prefix.rfind("/") + 1]


def _output_root(output_uri: str, role: str) -> tuple[str, str]:
    bucket, prefix = parse_s3_uri(output_uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, f"{prefix}{role}/"


def _check_request(plan: ShardPlan, source_uri: str, output_uri: str, mode: str, role: str):
    if mode not in MODES:
        raise ShardPlanError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    check_channel_name(role)
    check_channel_name(f"{role}_{max(plan.num_shards - 1, 0)}")
    src_bucket, src_prefix = parse_s3_uri(source_uri)
    out_bucket, out_root = check_output_outside_source(source_uri, output_uri, role)
    folder = _folder(src_prefix)
    outside = next((k for _, k, _ in plan.items() if not k.startswith(src_prefix)), None)
    if outside is not None:
        raise ShardPlanError(
            f"key {outside!r} of the plan is not under the source {source_uri}; "
            "plan the shards from a listing of that same prefix"
        )
    return src_bucket, folder, out_bucket, out_root


def check_output_outside_source(source_uri: str, output_uri: str, role: str = "train") -> tuple[str, str]:
    """Refuse an output folder ``<output>/<role>/`` that overlaps the source prefix (needs no S3 call).

    Returns the output (bucket, key prefix of the role's folder).
    """
    src_bucket, src_prefix = parse_s3_uri(source_uri)
    out_bucket, out_root = _output_root(output_uri, role)
    if out_bucket == src_bucket and (out_root.startswith(src_prefix) or src_prefix.startswith(out_root)):
        raise ShardPlanError(
            f"output s3://{out_bucket}/{out_root} overlaps the source {source_uri}: a later listing "
            "would shard the outputs too. Choose an output prefix outside the source prefix."
        )
    return out_bucket, out_root


def _run_all(tasks: list[tuple[str, Callable[[], object]]], workers: int) -> None:
    """Run (label, callable) tasks concurrently; on the first failure cancel the rest and raise."""
    if not tasks:
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fn): label for label, fn in tasks}
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        wait(pending)
    failed = [(label, f.exception()) for f, label in futures.items() if not f.cancelled() and f.exception()]
    if failed:
        label, exc = failed[0]
        finished = sum(1 for f in futures if not f.cancelled() and f.exception() is None)
        raise ShardWriteError(
            f"{label} failed: {exc}; {finished} of {len(tasks)} finished, {len(failed)} failed, the rest "
            "were cancelled. Nothing was marked complete: fix the cause and run again (copies that "
            "finished are skipped)."
        ) from exc


def _shard_uris(num_shards: int, out_bucket: str, out_root: str, mode: str) -> list[str]:
    if mode == COPY:
        return [s3_uri(out_bucket, f"{out_root}{k}/") for k in range(num_shards)]
    return [s3_uri(out_bucket, f"{out_root}{k}.manifest") for k in range(num_shards)]


def plan_shard_set(
    plan: ShardPlan, source_uri: str, output_uri: str, mode: str = MANIFEST, role: str = "train"
) -> ShardSet:
    """The ShardSet ``write_shards`` with these arguments returns, without writing anything.

    The same checks run (mode, channel names, keys under the source, no overlap with the output),
    so a caller can build and validate a whole job from the planned URIs before the first write.
    """
    _, _, out_bucket, out_root = _check_request(plan, source_uri, output_uri, mode, role)
    return _planned(plan, source_uri, output_uri, mode, role, out_bucket, out_root)


def _planned(plan, source_uri, output_uri, mode, role, out_bucket, out_root) -> ShardSet:
    return ShardSet(
        role=role,
        mode=mode,
        s3_data_type=S3_DATA_TYPES[mode],
        uris=_shard_uris(plan.num_shards, out_bucket, out_root, mode),
        source_uri=source_uri,
        output_uri=output_uri,
        objects_per_shard=plan.objects_per_shard,
        bytes_per_shard=plan.bytes_per_shard,
        plan_uri=s3_uri(out_bucket, f"{out_root}{COMPLETE_MARKER}"),
    )


def write_shards(
    plan: ShardPlan,
    source_uri: str,
    output_uri: str,
    mode: str = MANIFEST,
    role: str = "train",
    client=None,
    *,
    workers: int = 16,
    transfer_config=None,
    progress: bool | None = None,
) -> ShardSet:
    """Write ``plan`` (keys listed from ``source_uri``) under ``output_uri`` and return where it lives.

    ``mode='manifest'`` writes one ManifestFile per shard; ``mode='copy'`` copies each object
    server-side into ``<out>/<role>/<k>/``. The complete marker is written only after everything else
    succeeded. ``progress=None`` shows a bar only on a terminal or in a notebook.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    src_bucket, folder, out_bucket, out_root = _check_request(plan, source_uri, output_uri, mode, role)
    planned = _planned(plan, source_uri, output_uri, mode, role, out_bucket, out_root)
    client = client or make_client(max_pool_connections=max(workers * 4, 10))
    marker_key = f"{out_root}{COMPLETE_MARKER}"
    try:
        client.head_bucket(Bucket=out_bucket)
        # From here on the output must not look complete until the new marker is written.
        client.delete_object(Bucket=out_bucket, Key=marker_key)
    except ClientError as exc:
        raise describe_client_error(
            exc, out_bucket, f"write to {output_uri}", missing_codes=("NoSuchBucket", "404")
        ) from exc
    except BotoCoreError as exc:
        raise unreachable(exc, f"write to {output_uri}") from exc

    copied = skipped = deleted = 0
    if mode == COPY:
        copied, skipped, deleted = _copy_shards(
            client, plan, src_bucket, folder, out_bucket, out_root, workers, transfer_config, progress
        )
    else:
        _put_manifests(client, plan, src_bucket, folder, planned.uris, workers, progress)
        deleted = _delete_stale_manifests(client, out_bucket, out_root, planned.uris)
    shard_set = replace(planned, copied=copied, skipped=skipped, deleted=deleted)
    try:
        body = shard_set.to_json().encode()
        client.put_object(Bucket=out_bucket, Key=marker_key, Body=body, ContentType="application/json")
    except ClientError as exc:
        raise describe_client_error(exc, out_bucket, f"write {shard_set.plan_uri}") from exc
    except BotoCoreError as exc:
        raise unreachable(exc, f"write {shard_set.plan_uri}") from exc
    return shard_set


def manifest_document(plan: ShardPlan, shard: int, src_bucket: str, folder: str) -> list:
    """SageMaker's ManifestFile content: ``[{"prefix": "s3://b/folder/"}, "rel/key", ...]``."""
    return [{"prefix": s3_uri(src_bucket, folder)}] + [k[len(folder) :] for k in plan.shards[shard]]


def _put_manifests(client, plan, src_bucket, folder, uris, workers, progress=None) -> None:
    def put(i: int, bar):
        out_bucket, key = parse_s3_uri(uris[i])
        body = json.dumps(manifest_document(plan, i, src_bucket, folder)).encode()
        client.put_object(Bucket=out_bucket, Key=key, Body=body, ContentType="application/json")
        bar.update(1)

    with progress_bar(
        len(uris), desc=f"write {len(uris)} manifests", unit=" manifests", enabled=progress
    ) as bar:
        _run_all([(f"writing {uri}", lambda i=i: put(i, bar)) for i, uri in enumerate(uris)], workers)


def _existing_objects(client, bucket: str, prefix: str) -> dict[str, int]:
    from botocore.exceptions import BotoCoreError, ClientError

    found: dict[str, int] = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", ()):
                found[item["Key"]] = int(item["Size"])
    except ClientError as exc:
        raise describe_client_error(exc, bucket, f"list s3://{bucket}/{prefix}") from exc
    except BotoCoreError as exc:
        raise unreachable(exc, f"list s3://{bucket}/{prefix}") from exc
    return found


_SHARD_DIR = re.compile(r"^(\d+)/")
_MANIFEST_NAME = re.compile(r"^\d+\.manifest$")


def _delete_stale_manifests(client, bucket: str, out_root: str, uris: list[str]) -> int:
    """Manifests numbered beyond this plan (an earlier run had more shards) would pass for shards."""
    wanted = {parse_s3_uri(u)[1] for u in uris}
    existing = _existing_objects(client, bucket, out_root)
    stale = [k for k in existing if k not in wanted and _MANIFEST_NAME.match(k[len(out_root) :])]
    _delete_stale(client, bucket, stale)
    return len(stale)


def _copy_shards(client, plan, src_bucket, folder, out_bucket, out_root, workers, transfer_config, progress):
    from boto3.s3.transfer import TransferConfig

    config = transfer_config or TransferConfig(
        multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB, max_concurrency=4
    )
    existing = _existing_objects(client, out_bucket, out_root)
    wanted: dict[str, int] = {}
    todo = []
    for shard, key, size in plan.items():
        dest = f"{out_root}{shard}/{key[len(folder) :]}"
        wanted[dest] = size
        if existing.get(dest) != size:
            todo.append((key, dest, size))
    skipped = len(wanted) - len(todo)
    # Objects in our shard folders that this plan does not hold would leak into S3Prefix channels.
    stale = [k for k in existing if k not in wanted and _SHARD_DIR.match(k[len(out_root) :])]

    total = sum(s for _, _, s in todo)
    bar = progress_bar(total, desc=f"copy {len(todo)} objects", unit="B", enabled=progress, unit_scale=True)

    def copy(src_key: str, dest: str, size: int):
        client.copy(
            CopySource={"Bucket": src_bucket, "Key": src_key}, Bucket=out_bucket, Key=dest, Config=config
        )
        bar.update(size)

    tasks = [
        (f"copying s3://{src_bucket}/{a} to s3://{out_bucket}/{b}", lambda a=a, b=b, n=n: copy(a, b, n))
        for a, b, n in todo
    ]
    try:
        _run_all(tasks, workers)
    finally:
        bar.close()
    _delete_stale(client, out_bucket, stale)
    return len(todo), skipped, len(stale)


def _delete_stale(client, bucket: str, keys: list[str]) -> None:
    """Delete ``keys`` 1,000 at a time; DeleteObjects reports per-key failures in its ``Errors`` list."""
    from botocore.exceptions import BotoCoreError, ClientError

    for start in range(0, len(keys), 1000):
        batch = [{"Key": k} for k in keys[start : start + 1000]]
        try:
            response = client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        except ClientError as exc:
            raise ShardWriteError(
                f"{describe_client_error(exc, bucket, 'delete stale shard objects')}. Nothing was marked "
                "complete; run again once the objects can be deleted"
            ) from exc
        except BotoCoreError as exc:
            raise ShardWriteError(f"{unreachable(exc, 'delete stale shard objects')}; run again") from exc
        errors = response.get("Errors") or []
        if errors:
            first = errors[0]
            raise ShardWriteError(
                f"S3 could not delete {len(errors)} stale object(s) of an earlier plan (first: "
                f"s3://{bucket}/{first.get('Key')}: {first.get('Code')}: {first.get('Message')}); they "
                "would leak into the S3Prefix channels. Nothing was marked complete: allow "
                "s3:DeleteObject on the output prefix (or remove them) and run again"
            )


def read_shard_set(output_uri: str, role: str = "train", client=None) -> ShardSet:
    """Load the shard set a finished ``write_shards`` recorded; IncompleteShardsError if none or broken."""
    from botocore.exceptions import BotoCoreError, ClientError

    out_bucket, out_root = _output_root(output_uri, role)
    key = f"{out_root}{COMPLETE_MARKER}"
    client = client or make_client()
    try:
        body = client.get_object(Bucket=out_bucket, Key=key)["Body"].read()
    except BotoCoreError as exc:
        raise unreachable(exc, f"read s3://{out_bucket}/{key}") from exc
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchKey", "404"):
            raise IncompleteShardsError(
                f"no complete {role!r} shards under {output_uri} (s3://{out_bucket}/{key} is missing: "
                "never written or interrupted); run 'sagemaker-dist shard' again"
            ) from exc
        raise describe_client_error(exc, out_bucket, f"read s3://{out_bucket}/{key}") from exc

    def incomplete(why: str) -> IncompleteShardsError:
        return IncompleteShardsError(
            f"s3://{out_bucket}/{key} is not a complete sagemaker-dist shard plan ({why}); run "
            "'sagemaker-dist shard' again to rewrite the shards and the marker"
        )

    try:
        doc = json.loads(body)
    except ValueError as exc:  # also UnicodeDecodeError
        raise incomplete(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise incomplete(f"a JSON {type(doc).__name__}, not an object")
    if doc.get("version") != MARKER_VERSION or not doc.get("complete"):
        raise incomplete(f"version {doc.get('version')!r}, complete {doc.get('complete')!r}")
    wanted = [f for f, spec in ShardSet.__dataclass_fields__.items() if spec.compare]
    missing = [f for f in wanted if f not in doc]
    if missing:
        raise incomplete(f"missing {', '.join(missing)}")
    shard_set = ShardSet(**{f: doc[f] for f in wanted}, plan_uri=s3_uri(out_bucket, key))
    sizes = {len(shard_set.uris), len(shard_set.objects_per_shard), len(shard_set.bytes_per_shard)}
    if len(sizes) != 1 or not shard_set.uris or shard_set.mode not in MODES:
        raise incomplete("its shard lists disagree or are empty")
    return shard_set


__all__ = [
    "COPY",
    "MANIFEST",
    "IncompleteShardsError",
    "S3AccessError",
    "ShardSet",
    "ShardWriteError",
    "check_output_outside_source",
    "plan_shard_set",
    "read_shard_set",
    "write_shards",
]
