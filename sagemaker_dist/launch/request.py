"""Render the CreateTrainingJob request: one pure function of the job's settings and resolved names.

``render_request`` takes the job's frozen settings (``RequestSettings``), the planned layout, each
role's channel sources and the names that need AWS (role ARN, output path, image); the dry run passes
stand-ins for them, the real launch the resolved values. It makes no AWS call and reads no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import FrozenInstanceError, dataclass, fields
from datetime import datetime, timezone
from pathlib import PurePosixPath

from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.distributions import distribution as registered
from sagemaker_dist.contract.distributions import names_where
from sagemaker_dist.contract.layout import PER_WORKER, ChannelLayout, LayoutError, check_distribution
from sagemaker_dist.contract.paths import (
    CHECKPOINT_LOCAL_PATH,
    CODE_CHANNEL,
    DEFAULT_ROOT,
    TENSORBOARD_LOCAL_PATH,
    OptMl,
)
from sagemaker_dist.contract.request_rules import MAX_JOB_NAME
from sagemaker_dist.contract.s3_uri import join_s3
from sagemaker_dist.launch.inputs import ChannelSource, EstimatorError, JobInputs
from sagemaker_dist.launch.source_package import TARBALL_NAME


@dataclass(kw_only=True)
class JobSettings:
    """What the request says of a job beyond its shape, layout and names, declared once with the
    defaults users get: ``DistributedEstimator`` takes these as its keyword arguments, and
    ``RequestSettings`` holds them checked and normalised for ``render_request``."""

    hyperparameters: Mapping | None = None
    input_mode: str = "Pipe"
    shared_channel_input_mode: str | None = "File"  # None: as input_mode
    record_wrapper: str = "None"
    shuffle_seed: int | None = None
    content_type: str | None = None
    checkpoint_s3_uri: str | None = None
    checkpoints: bool = True
    tensorboard_s3_uri: str | None = None
    tensorboard: bool = True
    max_run: int = 24 * 3600
    use_spot: bool = False
    max_wait: int | None = None
    volume_size: int = 30
    volume_kms_key: str | None = None
    output_kms_key: str | None = None
    subnets: Sequence[str] | None = None
    security_group_ids: Sequence[str] | None = None
    enable_network_isolation: bool = False
    encrypt_inter_container_traffic: bool = False
    tags: Mapping | Sequence[Mapping] | None = None
    environment: Mapping[str, str] | None = None
    mpi_options: str | Sequence[str] = ()


@dataclass(kw_only=True)
class RequestSettings(JobSettings):
    """The job's settings as the request says them: ``JobSettings`` checked and normalised
    (``DistributedEstimator.request_settings``: tuples, dicts, one mpirun option string) with the job's
    shape, and frozen once made, so that rendering cannot change them and needs no estimator."""

    instance_type: str
    instance_count: int

    def __post_init__(self):
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise FrozenInstanceError(f"cannot assign to field {name!r}: the request's settings are frozen")
        object.__setattr__(self, name, value)

    @classmethod
    def of(cls, settings) -> RequestSettings:
        """The settings of ``settings`` (an object with these attributes: the estimator)."""
        values = {f.name: getattr(settings, f.name) for f in fields(cls)}
        for name in ("subnets", "security_group_ids", "tags"):
            values[name] = tuple(values[name] or ())
        values["hyperparameters"] = dict(values["hyperparameters"] or {})
        values["environment"] = dict(values["environment"] or {})
        return cls(**values)


# Added after the toolkit's own mpirun options (NCCL_SOCKET_IFNAME, -bind-to none, -map-by slot).
DEFAULT_MPI_OPTIONS = (
    # Containers lack CAP_SYS_PTRACE, so Open MPI's CMA single-copy fails; plain shared memory works.
    "-x OMPI_MCA_btl_vader_single_copy_mechanism=none",
    # A stalled rank (e.g. one short of data) ends the job after 15 minutes instead of hanging it.
    "-x HOROVOD_STALL_CHECK_TIME_SECONDS=60",
    "-x HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=900",
    # The toolkit parses --NCCL_DEBUG out of these options and always adds -x NCCL_DEBUG=<value>
    # (INFO unless given): a plain -x NCCL_DEBUG=WARN would only add a second, conflicting -x.
    "--NCCL_DEBUG WARN",
)
CODE_CHANNEL_DIR = str(OptMl(PurePosixPath(DEFAULT_ROOT)).channel_dir(CODE_CHANNEL))


@dataclass(frozen=True)
class ResolvedNames:
    """What the request needs from AWS (or stand-ins for it in a dry run)."""

    job_name: str
    role_arn: str
    output_path: str
    source_uri: str  # where sourcedir.tar.gz is in S3
    image: str


def check_distribution_options(distribution: str, mpi_options, default_mpi_options: bool) -> None:
    """The distribution is known, and no mpirun option comes with one that runs no MPI."""
    try:
        check_distribution(distribution, 1)
    except LayoutError as exc:
        raise EstimatorError(str(exc)) from None
    if registered(distribution).mpi:
        return
    given = ["mpi_options"] if mpi_options else []
    if not default_mpi_options:
        given.append("default_mpi_options=False")
    if given:
        raise EstimatorError(
            f"{', '.join(given)} is a Horovod (mpirun) option, and distribution {distribution!r} runs no "
            f"MPI; drop it, or use {names_where(lambda d: d.mpi)}"
        )


def check_mpi_options(options: Sequence[str]) -> None:
    """The toolkit splits the options on whitespace (no shell quoting) and owns ``-x NCCL_DEBUG``."""
    for option in options:
        if not isinstance(option, str):
            raise EstimatorError(f"mpi_options entry {option!r} is not a string; give mpirun options as text")
        if "'" in option or '"' in option:
            raise EstimatorError(
                f"mpi_options {option!r} has quotes; the sagemaker-training toolkit splits the options on "
                "whitespace and keeps quotes as literal characters, so give values without spaces or "
                "quotes (e.g. -x NAME=value)"
            )
        if re.search(r"(^|\s)-x\s+NCCL_DEBUG=", option):
            raise EstimatorError(
                f"mpi_options {option!r} sets NCCL_DEBUG with -x; the toolkit always adds its own "
                "-x NCCL_DEBUG, so write --NCCL_DEBUG <level> instead (e.g. --NCCL_DEBUG INFO)"
            )


def user_hyperparameters(hyperparameters: Mapping | None) -> dict[str, str]:
    """The user's hyperparameters as SageMaker stores them; the framework's own names are refused."""
    hps = {}
    for key, value in (hyperparameters or {}).items():
        if not isinstance(key, str) or not key:
            raise EstimatorError(f"hyperparameter key {key!r} must be a non-empty string")
        if key in hp.FRAMEWORK_HYPERPARAMETERS:
            raise EstimatorError(
                f"hyperparameter {key!r} is set by sagemaker-dist; use the estimator's arguments "
                "(entry_point, processes_per_host, mpi_options) instead"
            )
        hps[key] = hp.encode_value(value)
    return hps


def tags_list(tags) -> list[dict]:
    if tags is None:
        return []
    if isinstance(tags, Mapping):
        return [{"Key": str(k), "Value": str(v)} for k, v in tags.items()]
    return [dict(t) for t in tags]


def framework_hyperparameters(
    layout: ChannelLayout, program: str, submit_directory: str, mpi_options: str
) -> dict[str, str]:
    """The hyperparameters the sagemaker-training toolkit reads: the distribution's (mpirun on every
    host for Horovod, TF_CONFIG and one process per host for MultiWorkerMirroredStrategy), our own."""
    launch = registered(layout.distribution).toolkit_hyperparameters(layout.processes_per_host, mpi_options)
    return {hp.PROGRAM: program, hp.SUBMIT_DIRECTORY: submit_directory, **launch, hp.LAYOUT: layout.to_json()}


def check_sources(layout: ChannelLayout, sources: Mapping[str, ChannelSource | str]) -> None:
    """Every role has one URI per channel of the layout (a bare prefix only for a single channel)."""
    for r in layout.roles:
        src = sources[r.role]
        if r.spread == PER_WORKER and not isinstance(src, ChannelSource):
            raise EstimatorError(
                f"{r.role} input {src!r} is a bare prefix; build_request needs it sharded into "
                f"{r.count} parts: use prepare()/launch(), or pass write_shards(...) output"
            )
        n = len(src.uris) if isinstance(src, ChannelSource) else 1
        if n != r.count:
            raise EstimatorError(
                f"{r.role} input has {n} shard(s) but the layout needs {r.count} channel(s) "
                f"({layout.hosts} host(s) x {layout.processes_per_host} process(es), strategy "
                f"{layout.strategy}); shard it into num_shards={r.count}"
            )


def _channel(est: RequestSettings, name: str, uri: str, data_type: str, distribution: str, mode: str):
    channel = {
        "ChannelName": name,
        "DataSource": {
            "S3DataSource": {"S3DataType": data_type, "S3Uri": uri, "S3DataDistributionType": distribution}
        },
        "InputMode": mode,
    }
    if est.content_type:
        channel["ContentType"] = est.content_type
    if mode == "Pipe":
        channel["RecordWrapperType"] = est.record_wrapper
    if est.shuffle_seed is not None:
        channel["ShuffleConfig"] = {"Seed": est.shuffle_seed}
    return channel


def _channels(
    est: RequestSettings, layout: ChannelLayout, sources, extras: Mapping[str, str], source_uri: str
):
    check_sources(layout, sources)
    channels = []
    for r in layout.roles:
        src = sources[r.role]
        uris, data_type = (
            (src.uris, src.s3_data_type) if isinstance(src, ChannelSource) else ((src,), "S3Prefix")
        )
        mode = est.input_mode if r.spread == PER_WORKER else est.shared_channel_input_mode
        channels += [_channel(est, n, u, data_type, r.distribution, mode) for n, u in zip(r.channels, uris)]
    channels += [
        _channel(est, n, extras[n], "S3Prefix", "FullyReplicated", est.shared_channel_input_mode)
        for n in layout.extra_channels
    ]
    if est.enable_network_isolation:  # the container cannot reach S3: the tarball comes as a File channel
        channels.append(
            {
                "ChannelName": CODE_CHANNEL,
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": source_uri,
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
                "InputMode": "File",
            }
        )
    return channels


def render_request(
    est: RequestSettings,
    layout: ChannelLayout,
    inputs: JobInputs,
    sources: Mapping[str, ChannelSource | str],
    names: ResolvedNames,
    program: str,
) -> dict:
    """The CreateTrainingJob request (boto3's shape) for these settings, channels and names."""
    submit_directory = (
        f"{CODE_CHANNEL_DIR}/{TARBALL_NAME}" if est.enable_network_isolation else names.source_uri
    )
    request = {
        "TrainingJobName": names.job_name,
        "RoleArn": names.role_arn,
        "AlgorithmSpecification": {"TrainingImage": names.image, "TrainingInputMode": est.input_mode},
        "HyperParameters": {
            **est.hyperparameters,
            **framework_hyperparameters(layout, program, submit_directory, est.mpi_options),
        },
        "InputDataConfig": _channels(est, layout, sources, inputs.extras, names.source_uri),
        "OutputDataConfig": _present(S3OutputPath=names.output_path, KmsKeyId=est.output_kms_key or None),
        "ResourceConfig": _present(
            InstanceType=est.instance_type,
            InstanceCount=est.instance_count,
            VolumeSizeInGB=est.volume_size,
            VolumeKmsKeyId=est.volume_kms_key or None,
        ),
        "StoppingCondition": _present(MaxRuntimeInSeconds=est.max_run, MaxWaitTimeInSeconds=est.max_wait),
        "EnableNetworkIsolation": bool(est.enable_network_isolation),
        "EnableInterContainerTrafficEncryption": bool(est.encrypt_inter_container_traffic),
        "EnableManagedSpotTraining": bool(est.use_spot),
    }
    return {**request, **_optional(est, names)}


def _present(**members) -> dict:
    """The members that have a value (SageMaker takes an absent member, not a null one)."""
    return {name: value for name, value in members.items() if value is not None}


def _optional(est: RequestSettings, names: ResolvedNames) -> dict:
    """The request's members that only some jobs have."""
    optional = {}
    if est.checkpoints:
        optional["CheckpointConfig"] = {
            "S3Uri": est.checkpoint_s3_uri or join_s3(names.output_path, names.job_name, "checkpoints"),
            "LocalPath": CHECKPOINT_LOCAL_PATH,
        }
    if est.tensorboard:
        optional["TensorBoardOutputConfig"] = {
            "S3OutputPath": est.tensorboard_s3_uri
            or join_s3(names.output_path, names.job_name, "tensorboard"),
            "LocalPath": TENSORBOARD_LOCAL_PATH,
        }
    if est.subnets:
        optional["VpcConfig"] = {"Subnets": est.subnets, "SecurityGroupIds": est.security_group_ids}
    if est.tags:
        optional["Tags"] = est.tags
    if est.environment:
        optional["Environment"] = dict(est.environment)
    return optional


def default_job_name(base: str, now: datetime | None = None) -> str:
    """``base-YYYYmmdd-HHMMSS-mmm``, with ``base`` cut so the whole stays within 63 characters."""
    now = now or datetime.now(timezone.utc)
    stamp = now.strftime("%Y%m%d-%H%M%S-") + f"{now.microsecond // 1000:03d}"
    base = re.sub(r"[^A-Za-z0-9-]", "-", base)[: MAX_JOB_NAME - len(stamp) - 1].strip("-") or "job"
    return f"{base}-{stamp}"
