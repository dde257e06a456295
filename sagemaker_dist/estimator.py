"""Launch a Horovod + Pipe-mode training job on SageMaker in a few lines.

``HorovodPipeEstimator`` turns an entry script, an instance type and count, and S3 inputs into one
CreateTrainingJob request (a plain boto3-shaped dict that local mode runs too): one Pipe channel per
worker from the channel layout, MPI configured the way the sagemaker-training toolkit in AWS images
expects it (hosts x processes ranks), the layout passed as a hyperparameter. The whole request is
validated before any AWS call; the job is created through SDK v3's ``sagemaker.core`` resources.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timezone

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from sagemaker_dist.images import container_image_uri
from sagemaker_dist.instances import UnknownInstanceTypeError, normalize_instance_type, processes_per_host
from sagemaker_dist.layout import (
    INPUT_MODES,
    LAYOUT_HYPERPARAMETER,
    PER_WORKER,
    SINGLE,
    ChannelLayout,
    check_channel_name,
    plan_layout,
)
from sagemaker_dist.request_validation import MAX_JOB_NAME, validate_request
from sagemaker_dist.source_package import (
    MAX_SOURCE_BYTES,
    TARBALL_NAME,
    SourcePackage,
    pack_source,
    resolve_entry_point,
    upload_source,
)

CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL_STATUSES = ("Completed", "Failed", "Stopped")
LAYOUT_ROLES = ("train", "validation", "eval")
CODE_CHANNEL = "code"
CODE_CHANNEL_DIR = f"/opt/ml/input/data/{CODE_CHANNEL}"

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
FRAMEWORK_HYPERPARAMETERS = (
    "sagemaker_program",
    "sagemaker_submit_directory",
    "sagemaker_mpi_enabled",
    "sagemaker_mpi_num_of_processes_per_host",
    "sagemaker_mpi_custom_mpi_options",
    LAYOUT_HYPERPARAMETER,
)
_PLACEHOLDER_ACCOUNT = "000000000000"
_PLACEHOLDER_OUTPUT = "s3://output-bucket-not-yet-resolved"


class EstimatorError(ValueError):
    """A job description that cannot become a valid Horovod training job."""


class AwsRequestError(EstimatorError):
    """An AWS call the estimator makes failed; the message names the error code and what to do."""


def aws_error(exc: Exception, action: str, advice: str) -> AwsRequestError:
    """A botocore ClientError or BotoCoreError as our error (the CLI prints it and exits 2)."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code, message = err.get("Code", "error"), err.get("Message", str(exc))
        return AwsRequestError(f"AWS refused to {action}: {code}: {message}; {advice}")
    return AwsRequestError(
        f"could not {action}: {exc}; check your network, AWS_ENDPOINT_URL (if you use one) and your "
        "AWS credentials"
    )


def _is_not_found(exc: ClientError) -> bool:
    err = exc.response.get("Error", {})
    message = str(err.get("Message", "")).lower()
    return err.get("Code") in ("ValidationException", "ResourceNotFound") and (
        "not found" in message or "could not find" in message or "does not exist" in message
    )


class TrainingJobFailed(RuntimeError):
    """The training job ended Failed or Stopped."""


@dataclass(frozen=True)
class ChannelSource:
    """Where the channels of one role read from: one URI per channel, all of one S3DataType."""

    uris: tuple[str, ...]
    s3_data_type: str = "S3Prefix"  # or ManifestFile


@dataclass(frozen=True)
class PreparedJob:
    """What ``prepare`` produced: the validated request, the layout and the uploaded source package.

    ``source.path`` was a temporary file and is gone; the tarball lives at the request's
    ``sagemaker_submit_directory``.
    """

    request: dict
    layout: ChannelLayout
    source: SourcePackage

    @property
    def job_name(self) -> str:
        return self.request["TrainingJobName"]


def _is_shard_set(spec) -> bool:
    return hasattr(spec, "uris") and hasattr(spec, "s3_data_type")


def _check_s3_uri(uri, what: str) -> str:
    if not isinstance(uri, str) or not re.match(r"^s3://[^/]+(/.*)?$", uri):
        raise EstimatorError(f"{what} is {uri!r}; give an S3 URI like 's3://bucket/prefix/'")
    return uri


def _as_source(spec, what: str) -> ChannelSource | str:
    """A ShardSet or a list of URIs becomes a ChannelSource; a bare S3 URI stays a str (to shard or share)."""
    if _is_shard_set(spec):
        return ChannelSource(tuple(_check_s3_uri(u, what) for u in spec.uris), spec.s3_data_type)
    if isinstance(spec, ChannelSource):
        return spec
    if isinstance(spec, str):
        return _check_s3_uri(spec, what)
    if isinstance(spec, Sequence) and spec:
        return ChannelSource(tuple(_check_s3_uri(u, f"{what} entry") for u in spec))
    raise EstimatorError(
        f"{what} is {spec!r}; give an S3 prefix, a list of S3 URIs (one per channel) or the ShardSet "
        "from sagemaker_dist.shard_writer.write_shards"
    )


def _check_mpi_options(options: Sequence[str]) -> None:
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


def _hyperparameter_value(value) -> str:
    """Strings as they are; anything else as JSON (the toolkit json-decodes every value it can)."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _tags(tags) -> list[dict]:
    if tags is None:
        return []
    if isinstance(tags, Mapping):
        return [{"Key": str(k), "Value": str(v)} for k, v in tags.items()]
    return [dict(t) for t in tags]


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))


def default_job_name(base: str, now: datetime | None = None) -> str:
    """``base-YYYYmmdd-HHMMSS-mmm``, with ``base`` cut so the whole stays within 63 characters."""
    now = now or datetime.now(timezone.utc)
    stamp = now.strftime("%Y%m%d-%H%M%S-") + f"{now.microsecond // 1000:03d}"
    base = re.sub(r"[^A-Za-z0-9-]", "-", base)[: MAX_JOB_NAME - len(stamp) - 1].strip("-") or "job"
    return f"{base}-{stamp}"


def role_arn(role: str, region: str | None = None, account: str | None = None, boto_session=None) -> str:
    """``role`` if it is an ARN, else ``arn:<partition>:iam::<account>:role/<role>`` (account via STS)."""
    if not isinstance(role, str) or not role.strip():
        raise EstimatorError("role is empty; give the IAM role SageMaker assumes, as an ARN or a role name")
    role = role.strip()
    if role.startswith("arn:"):
        if not re.match(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$", role):
            raise EstimatorError(f"role {role!r} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)")
        return role
    if not re.match(r"^[\w+=,.@/-]{1,512}$", role):
        raise EstimatorError(f"role {role!r} is neither an IAM role ARN nor a role name")
    if account is None:
        sts = (boto_session or boto3.Session()).client("sts", region_name=region)
        account = sts.get_caller_identity()["Account"]
    partition = (
        "aws-cn"
        if (region or "").startswith("cn-")
        else ("aws-us-gov" if (region or "").startswith("us-gov-") else "aws")
    )
    return f"arn:{partition}:iam::{account}:role/{role.lstrip('/')}"


@dataclass
class HorovodPipeEstimator:
    """Describe a Horovod job once; ``launch(inputs)`` (alias ``fit``) shards, uploads and creates it.

    ``inputs`` maps ``train`` (required), ``validation`` and ``eval`` to S3 prefixes, URI lists or
    ShardSets; other keys become extra channels every rank shares. A bare prefix for a per-worker
    role is sharded into balanced manifests (no copying) under the job's output path.

    Construction checks everything that needs no AWS call and raises EstimatorError (a ValueError).
    ``processes_per_host`` defaults to the GPUs of ``instance_type``; give it for CPU types or to run
    fewer processes than GPUs. ``validation`` is how a validation *prefix* is used: ``'single'`` (one
    channel every rank reads in full) or ``'per-worker'`` (sharded). ``shared_channel_input_mode`` is
    the input mode of channels all ranks share (single roles, extra channels): File by default,
    since a Pipe FIFO can have only one reader. ``mpi_options`` extend ``DEFAULT_MPI_OPTIONS``
    (drop those with ``default_mpi_options=False``).
    """

    entry_point: str
    role: str
    instance_type: str
    instance_count: int = 1
    _: KW_ONLY
    source_dir: str | None = None
    image_uri: str | None = None
    processes_per_host: int | None = None
    hyperparameters: Mapping | None = None
    input_mode: str = "Pipe"
    strategy: str = "auto"
    validation: str = SINGLE
    shared_channel_input_mode: str | None = "File"
    record_wrapper: str = "None"
    shuffle_seed: int | None = None
    content_type: str | None = None
    output_path: str | None = None
    code_location: str | None = None
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
    default_mpi_options: bool = True
    base_job_name: str = "sagemaker-dist"
    max_source_bytes: int = MAX_SOURCE_BYTES
    sagemaker_session: object = field(default=None, repr=False)

    def __post_init__(self):
        self.instance_type = normalize_instance_type(self.instance_type)
        count = self.instance_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise EstimatorError(f"instance_count={count!r}; it must be a whole number >= 1")
        self.processes_per_host = self._processes_per_host(self.processes_per_host)
        if self.input_mode not in INPUT_MODES:
            raise EstimatorError(f"input_mode={self.input_mode!r}; use one of {', '.join(INPUT_MODES)}")
        if self.shared_channel_input_mode not in (None, *INPUT_MODES):
            raise EstimatorError(
                f"shared_channel_input_mode={self.shared_channel_input_mode!r}; use None or "
                f"one of {', '.join(INPUT_MODES)}"
            )
        self.shared_channel_input_mode = self.shared_channel_input_mode or self.input_mode
        if self.validation not in (SINGLE, PER_WORKER):
            raise EstimatorError(f"validation={self.validation!r}; use 'single' or 'per-worker'")
        self.hyperparameters = self._user_hyperparameters(self.hyperparameters)
        for what in ("output_path", "code_location", "checkpoint_s3_uri", "tensorboard_s3_uri"):
            if getattr(self, what) is not None:
                _check_s3_uri(getattr(self, what), what)
        if bool(self.subnets) != bool(self.security_group_ids):
            raise EstimatorError("VPC config needs both subnets= and security_group_ids= (or neither)")
        self.subnets = list(self.subnets or [])
        self.security_group_ids = list(self.security_group_ids or [])
        self.tags = _tags(self.tags)
        self.environment = {str(k): str(v) for k, v in (self.environment or {}).items()}
        extra = [self.mpi_options] if isinstance(self.mpi_options, str) else list(self.mpi_options)
        _check_mpi_options(extra)
        defaults = DEFAULT_MPI_OPTIONS if self.default_mpi_options else ()
        self.mpi_options = " ".join([*defaults, *extra]).strip()

    # ----- local planning (no AWS) -----

    def _processes_per_host(self, override: int | None) -> int:
        try:
            return processes_per_host(self.instance_type, override)
        except UnknownInstanceTypeError as exc:  # only without an override
            if "processes_per_host=" in str(exc):
                raise
            raise UnknownInstanceTypeError(
                f"{exc} With HorovodPipeEstimator pass processes_per_host=N."
            ) from None

    @staticmethod
    def _user_hyperparameters(hyperparameters: Mapping | None) -> dict[str, str]:
        hps = {}
        for key, value in (hyperparameters or {}).items():
            if not isinstance(key, str) or not key:
                raise EstimatorError(f"hyperparameter key {key!r} must be a non-empty string")
            if key in FRAMEWORK_HYPERPARAMETERS:
                raise EstimatorError(
                    f"hyperparameter {key!r} is set by sagemaker-dist; use the estimator's arguments "
                    "(entry_point, processes_per_host, mpi_options) instead"
                )
            hps[key] = _hyperparameter_value(value)
        return hps

    @property
    def world_size(self) -> int:
        """Total Horovod ranks: hosts x processes per host."""
        return self.instance_count * self.processes_per_host

    def _split_inputs(self, inputs) -> tuple[dict, dict]:
        if isinstance(inputs, str) or _is_shard_set(inputs):
            inputs = {"train": inputs}
        if not isinstance(inputs, Mapping) or "train" not in inputs:
            raise EstimatorError(
                "inputs need a 'train' entry: launch({'train': 's3://bucket/prefix/'}) or launch('s3://...')"
            )
        roles = {k: _as_source(v, f"inputs[{k!r}]") for k, v in inputs.items() if k in LAYOUT_ROLES}
        extras = {}
        for name, spec in inputs.items():
            if name not in LAYOUT_ROLES:
                check_channel_name(name)
                if not isinstance(spec, str):
                    raise EstimatorError(f"extra channel {name!r} takes one S3 URI, not {spec!r}")
                extras[name] = _check_s3_uri(spec, f"inputs[{name!r}]")
        return roles, extras

    def plan(self, inputs) -> ChannelLayout:
        """The channel layout for these inputs (pure: no AWS call)."""
        roles, extras = self._split_inputs(inputs)
        validation = None
        if "validation" in roles:
            spec = roles["validation"]
            per_worker = isinstance(spec, ChannelSource) and len(spec.uris) > 1
            validation = (
                PER_WORKER
                if per_worker or (isinstance(spec, str) and self.validation == PER_WORKER)
                else SINGLE
            )
        layout = plan_layout(
            self.instance_count,
            self.processes_per_host,
            strategy=self.strategy,
            validation=validation,
            eval_channel="eval" in roles,
            extra_channels=tuple(extras),
            reserved_channels=1 if self.enable_network_isolation else 0,  # the code channel
            input_mode=self.input_mode,
            record_wrapper=self.record_wrapper,
            shuffle_seed=self.shuffle_seed,
        )
        self._check_shared_channels(layout)
        return layout

    def _check_shared_channels(self, layout: ChannelLayout) -> None:
        """A Pipe FIFO has one reader: channels every rank shares cannot be Pipe with several ranks a host."""
        shared = [r.base for r in layout.roles if r.spread == SINGLE] + list(layout.extra_channels)
        if shared and self.shared_channel_input_mode == "Pipe" and layout.processes_per_host > 1:
            raise EstimatorError(
                f"channel(s) {', '.join(shared)} are shared by all {layout.processes_per_host} processes "
                "on each host, but a Pipe-mode FIFO has one reader (several readers split its bytes "
                "and stall the job); use shared_channel_input_mode='File' or 'FastFile', or "
                "validation='per-worker' for the validation data"
            )

    def _check_sources(self, layout: ChannelLayout, sources: Mapping[str, ChannelSource | str]) -> None:
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

    def _channel(self, name: str, uri: str, data_type: str, distribution: str, mode: str) -> dict:
        channel = {
            "ChannelName": name,
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": data_type,
                    "S3Uri": uri,
                    "S3DataDistributionType": distribution,
                }
            },
            "InputMode": mode,
        }
        if self.content_type:
            channel["ContentType"] = self.content_type
        if mode == "Pipe":
            channel["RecordWrapperType"] = self.record_wrapper
        if self.shuffle_seed is not None:
            channel["ShuffleConfig"] = {"Seed": self.shuffle_seed}
        return channel

    def _channels(self, layout: ChannelLayout, sources, extras: Mapping[str, str]) -> list[dict]:
        self._check_sources(layout, sources)
        channels = []
        for r in layout.roles:
            src = sources[r.role]
            uris, data_type = (
                (src.uris, src.s3_data_type) if isinstance(src, ChannelSource) else ((src,), "S3Prefix")
            )
            mode = self.input_mode if r.spread == PER_WORKER else self.shared_channel_input_mode
            channels += [
                self._channel(n, u, data_type, r.distribution, mode) for n, u in zip(r.channels, uris)
            ]
        channels += [
            self._channel(n, extras[n], "S3Prefix", "FullyReplicated", self.shared_channel_input_mode)
            for n in layout.extra_channels
        ]
        return channels

    def framework_hyperparameters(self, layout: ChannelLayout, program: str, submit_directory: str) -> dict:
        """The hyperparameters the sagemaker-training toolkit reads to run mpirun on every host."""
        return {
            "sagemaker_program": program,
            "sagemaker_submit_directory": submit_directory,
            "sagemaker_mpi_enabled": "true",
            "sagemaker_mpi_num_of_processes_per_host": str(layout.processes_per_host),
            "sagemaker_mpi_custom_mpi_options": self.mpi_options,
            LAYOUT_HYPERPARAMETER: layout.to_json(),
        }

    def _image(self, account: str | None = None) -> str:
        """``image_uri``, else our container in the caller's ECR (``account`` given: no STS call)."""
        if self.image_uri:
            return self.image_uri
        return container_image_uri(region=self._region(), account=account)

    def _region(self) -> str | None:
        if self.sagemaker_session is not None:
            return self.sagemaker_session.boto_region_name
        return boto3.session.Session().region_name

    def _submit_directory(self, source_uri: str) -> str:
        """Where the toolkit gets the source: S3, or with network isolation the ``code`` channel's file."""
        if self.enable_network_isolation:
            return f"{CODE_CHANNEL_DIR}/{TARBALL_NAME}"
        return source_uri

    def _code_channel(self, source_uri: str) -> list[dict]:
        """With network isolation the container cannot reach S3, so the tarball comes in as a File channel."""
        if not self.enable_network_isolation:
            return []
        source = {"S3DataType": "S3Prefix", "S3Uri": source_uri, "S3DataDistributionType": "FullyReplicated"}
        return [{"ChannelName": CODE_CHANNEL, "DataSource": {"S3DataSource": source}, "InputMode": "File"}]

    def _request(
        self, layout, sources, extras, job_name, program, submit_directory, role, output_path, image=None
    ) -> dict:
        request = {
            "TrainingJobName": job_name,
            "RoleArn": role,
            "AlgorithmSpecification": {
                "TrainingImage": image or self._image(),
                "TrainingInputMode": self.input_mode,
            },
            "HyperParameters": {
                **self.hyperparameters,
                **self.framework_hyperparameters(layout, program, self._submit_directory(submit_directory)),
            },
            "InputDataConfig": self._channels(layout, sources, extras) + self._code_channel(submit_directory),
            "OutputDataConfig": {"S3OutputPath": output_path},
            "ResourceConfig": {
                "InstanceType": self.instance_type,
                "InstanceCount": self.instance_count,
                "VolumeSizeInGB": self.volume_size,
            },
            "StoppingCondition": {"MaxRuntimeInSeconds": self.max_run},
            "EnableNetworkIsolation": bool(self.enable_network_isolation),
            "EnableInterContainerTrafficEncryption": bool(self.encrypt_inter_container_traffic),
            "EnableManagedSpotTraining": bool(self.use_spot),
        }
        if self.output_kms_key:
            request["OutputDataConfig"]["KmsKeyId"] = self.output_kms_key
        if self.volume_kms_key:
            request["ResourceConfig"]["VolumeKmsKeyId"] = self.volume_kms_key
        if self.max_wait is not None:
            request["StoppingCondition"]["MaxWaitTimeInSeconds"] = self.max_wait
        if self.checkpoints:
            request["CheckpointConfig"] = {
                "S3Uri": self.checkpoint_s3_uri or _join(output_path, job_name, "checkpoints"),
                "LocalPath": CHECKPOINT_LOCAL_PATH,
            }
        if self.tensorboard:
            request["TensorBoardOutputConfig"] = {
                "S3OutputPath": self.tensorboard_s3_uri or _join(output_path, job_name, "tensorboard"),
                "LocalPath": TENSORBOARD_LOCAL_PATH,
            }
        if self.subnets:
            request["VpcConfig"] = {"Subnets": self.subnets, "SecurityGroupIds": self.security_group_ids}
        if self.tags:
            request["Tags"] = self.tags
        if self.environment:
            request["Environment"] = dict(self.environment)
        return request

    def source_uri(self, output_path: str, job_name: str) -> str:
        """Where the job's ``sourcedir.tar.gz`` goes: ``<code_location or output_path>/<job>/source/``."""
        return _join(self.code_location or output_path, job_name, "source", TARBALL_NAME)

    def build_request(
        self,
        inputs,
        job_name: str | None = None,
        *,
        submit_directory: str | None = None,
        role: str | None = None,
    ) -> dict:
        """The CreateTrainingJob request for already-sharded inputs, validated; no S3 writes.

        Per-worker roles need one URI per channel (a ShardSet or a list). ``role`` overrides the
        resolved role ARN; a role *name* is turned into an ARN with one STS call.
        """
        layout = self.plan(inputs)
        roles, extras = self._split_inputs(inputs)
        job_name = job_name or default_job_name(self.base_job_name)
        output_path = self._output_path()
        program = self._program()
        request = self._request(
            layout,
            roles,
            extras,
            job_name,
            program,
            submit_directory or self.source_uri(output_path, job_name),
            role or role_arn(self.role, self._region(), boto_session=self._boto_session()),
            output_path,
        )
        validate_request(request)
        return request

    def _program(self) -> str:
        return resolve_entry_point(self.entry_point, self.source_dir)[1]

    def draft_request(self, inputs, job_name: str | None = None) -> dict:
        """The request with stand-ins for what needs AWS, validated; makes no AWS call.

        A bare prefix stands in for each shard manifest, account 000000000000 for the caller's
        account (role name, default image) and a placeholder bucket for an unset output path;
        everything else is final.
        """
        layout = self.plan(inputs)
        roles, extras = self._split_inputs(inputs)
        job_name = job_name or default_job_name(self.base_job_name)
        sources = {
            r.role: ChannelSource((roles[r.role],) * r.count)
            if isinstance(roles[r.role], str)
            else roles[r.role]
            for r in layout.roles
        }
        output = self._output_path(resolve=False)
        request = self._request(
            layout,
            sources,
            extras,
            job_name,
            self._program(),
            self.source_uri(output, job_name),
            role_arn(self.role, self._region(), account=_PLACEHOLDER_ACCOUNT),
            output,
            image=self._image(account=_PLACEHOLDER_ACCOUNT),
        )
        validate_request(request)
        return request

    # ----- AWS edges -----

    def _output_path(self, resolve: bool = True) -> str:
        if self.output_path:
            return self.output_path.rstrip("/")
        if not resolve:
            return _PLACEHOLDER_OUTPUT
        if self.sagemaker_session is None:
            raise EstimatorError(
                "no output_path and no sagemaker_session; pass output_path='s3://bucket/prefix' or "
                "sagemaker_session=Session(default_bucket=...)"
            )
        return f"s3://{self.sagemaker_session.default_bucket()}/{self.base_job_name}"

    def _s3_client(self):
        if self.sagemaker_session is not None:
            return self.sagemaker_session.boto_session.client("s3")
        return boto3.client("s3")

    def _plan_shards(self, prefix: str, r, client):
        """List ``prefix`` and balance it into ``r.count`` shards (pure after the listing)."""
        from sagemaker_dist.s3_objects import list_objects
        from sagemaker_dist.sharding import check_host_split, plan_shards

        objects = list_objects(prefix, client=client)  # raises EmptyPrefixError if there are none
        plan = plan_shards([(o.key, o.size) for o in objects], r.count)
        check_host_split(plan, self.instance_count, r.distribution, r.role)
        return plan

    def check_job_name_free(self, job_name: str) -> None:
        """Raise EstimatorError if a training job called ``job_name`` exists (DescribeTrainingJob).

        CreateTrainingJob refuses a name in use only after prepare() wrote the shards and the source
        under ``<output_path>/<job_name>/``, overwriting those of the job that has the name.
        """
        client = self._boto_session().client("sagemaker")  # honours AWS_ENDPOINT_URL
        try:
            job = client.describe_training_job(TrainingJobName=job_name)
        except ClientError as exc:
            if _is_not_found(exc):
                return
            raise aws_error(
                exc,
                f"describe training job {job_name!r}",
                "the job name must be checked before anything is written to S3: allow "
                "sagemaker:DescribeTrainingJob for these credentials",
            ) from exc
        except BotoCoreError as exc:
            raise aws_error(exc, f"describe training job {job_name!r}", "") from exc
        raise EstimatorError(
            f"a training job named {job_name!r} already exists (status {job.get('TrainingJobStatus')}); "
            "job names are unique per account and region: pass another job_name= (CLI: --job-name), or "
            "leave it out for a time-stamped name"
        )

    def prepare(
        self,
        inputs,
        job_name: str | None = None,
        *,
        printer: Callable[[str], None] | None = print,
        check_job_name: bool = True,
    ) -> PreparedJob:
        """Everything up to CreateTrainingJob: check, shard, upload the source, return the request.

        All local checks (layout, entry script, source size, the whole request with placeholders for
        what needs AWS) run before the first AWS call, and the job name is checked to be free before
        the first write, so bad input leaves nothing behind. ``check_job_name=False`` skips the
        DescribeTrainingJob call, for runs that create no SageMaker job (local mode).
        """
        say = printer or (lambda _line: None)
        job_name = job_name or default_job_name(self.base_job_name)
        with tempfile.TemporaryDirectory(prefix="sagemaker-dist-src-") as tmp:
            package = pack_source(
                self.entry_point, self.source_dir, dest_dir=tmp, max_bytes=self.max_source_bytes
            )
            self.draft_request(inputs, job_name)
            for line in self.plan(inputs).explain():
                say(line)
            request, layout = self._prepare_on_aws(inputs, job_name, package, say, check_job_name)
        return PreparedJob(request, layout, package)

    def _prepare_on_aws(
        self, inputs, job_name: str, package: SourcePackage, say, check_job_name: bool = True
    ) -> tuple[dict, ChannelLayout]:
        """The AWS part of ``prepare``: resolve output and role, shard bare prefixes, upload the source.

        Every role is listed and planned, and the whole request built and validated from the planned
        manifest URIs, before the first write: a role that cannot be sharded leaves nothing behind.
        """
        from sagemaker_dist.shard_writer import MANIFEST, plan_shard_set, write_shards

        layout = self.plan(inputs)
        roles, extras = self._split_inputs(inputs)
        output_path = self._output_path()
        role = role_arn(self.role, self._region(), boto_session=self._boto_session())
        if check_job_name:
            self.check_job_name_free(job_name)
        client = self._s3_client()
        shards_uri = _join(output_path, job_name, "shards") + "/"
        sources, writes = {}, []
        for r in layout.roles:
            spec = roles[r.role]
            if isinstance(spec, str) and r.spread == PER_WORKER:
                say(f"sharding {spec} into {r.count} manifest(s) for {r.role}")
                plan = self._plan_shards(spec, r, client)
                planned = plan_shard_set(plan, spec, shards_uri, MANIFEST, r.role)
                writes.append((plan, spec, r.role))
                spec = ChannelSource(tuple(planned.uris), planned.s3_data_type)
            sources[r.role] = spec
        submit = self.source_uri(output_path, job_name)
        request = self._request(
            layout, sources, extras, job_name, package.entry_point, submit, role, output_path
        )
        validate_request(request)
        for plan, prefix, base in writes:
            write_shards(plan, prefix, shards_uri, mode=MANIFEST, role=base, client=client)
        upload_source(package, submit, client=client)
        say(f"uploaded {len(package.files)} source file(s) ({package.source_bytes} bytes) to {submit}")
        return request, layout

    def launch(
        self,
        inputs,
        job_name: str | None = None,
        *,
        wait: bool = True,
        poll: float = 30.0,
        timeout: float | None = None,
        printer: Callable[[str], None] | None = print,
        local: bool = False,
        **local_options,
    ):
        """Create the training job; with ``wait`` print its progress until it ends. Returns a handle.

        ``local=True`` runs the very same request on this machine instead (real FIFOs, real
        ``horovodrun`` ranks; see ``sagemaker_dist.local.run_local``, which takes ``local_options``)
        and returns its ``LocalJobResult``.
        """
        if local_options and not local:
            raise EstimatorError(
                f"{', '.join(sorted(local_options))} only apply with local=True; "
                "drop them to launch on SageMaker"
            )
        say = printer or (lambda _line: None)
        prepared = self.prepare(inputs, job_name, printer=printer, check_job_name=not local)
        if local:
            from sagemaker_dist.local import run_local

            source_dir = resolve_entry_point(self.entry_point, self.source_dir)[0]
            return run_local(prepared.request, source_dir, echo=say, timeout=timeout, **local_options)
        job = create_training_job(prepared.request, self._boto_session())
        handle = TrainingJobHandle(job, self._boto_session())
        say(
            f"created training job {handle.name} ({self.instance_count} x {self.instance_type}, "
            f"{self.world_size} Horovod ranks)"
        )
        if wait:
            handle.wait(poll=poll, timeout=timeout, printer=printer)
        return handle

    fit = launch

    def _boto_session(self):
        if self.sagemaker_session is not None:
            return self.sagemaker_session.boto_session
        return boto3.Session()


def create_training_job(request: Mapping, boto_session=None):
    """CreateTrainingJob through SDK v3: ``sagemaker.core.resources.TrainingJob.create``."""
    from sagemaker.core.resources import TrainingJob
    from sagemaker.core.utils.code_injection.codec import transform

    boto_session = boto_session or boto3.Session()
    name = request.get("TrainingJobName")
    try:
        return TrainingJob.create(
            **transform(dict(request), "CreateTrainingJobRequest"),
            session=boto_session,
            region=boto_session.region_name,
        )
    except (ClientError, BotoCoreError) as exc:
        raise aws_error(
            exc,
            f"create training job {name!r}",
            "no job was created; fix what the message names (role, limits, quotas, image, S3 access) "
            "and launch again with another job_name (the shards and source of this attempt are "
            "already in S3 under its name)",
        ) from exc


def sdk_channels(request: Mapping) -> list:
    """The request's channels as ``sagemaker.core.shapes.Channel`` objects, for SDK v3 users."""
    from sagemaker.core.shapes import Channel
    from sagemaker.core.utils.code_injection.codec import transform

    return [Channel(**transform(c, "Channel")) for c in request["InputDataConfig"]]


class TrainingJobHandle:
    """A launched job: status, CloudWatch log streams, ``wait()`` and ``stop()``."""

    def __init__(self, training_job, boto_session=None):
        self.training_job = training_job  # sagemaker.core.resources.TrainingJob
        self._boto_session = boto_session

    @property
    def name(self) -> str:
        return self.training_job.training_job_name

    @property
    def arn(self) -> str:
        return self.training_job.training_job_arn

    def _client(self, service: str):
        return (self._boto_session or boto3.Session()).client(service)

    def describe(self) -> dict:
        """DescribeTrainingJob, as boto3 returns it."""
        response = self._client("sagemaker").describe_training_job(TrainingJobName=self.name)
        response.pop("ResponseMetadata", None)
        return response

    def log_stream_names(self) -> list[str]:
        """The job's CloudWatch log streams (``<job>/algo-N-<epoch>``); empty until instances start."""
        logs = self._client("logs")
        try:
            pages = logs.get_paginator("describe_log_streams").paginate(
                logGroupName=LOG_GROUP, logStreamNamePrefix=f"{self.name}/"
            )
            return [s["logStreamName"] for page in pages for s in page.get("logStreams", [])]
        except ClientError:  # no log group yet, or no logs:DescribeLogStreams permission
            return []

    def wait(
        self, poll: float = 30.0, timeout: float | None = None, printer: Callable[[str], None] | None = print
    ) -> str:
        """Poll until the job ends, printing each status transition and new log stream; return the status.

        Raises TrainingJobFailed with the failure reason if the job fails or is stopped.
        """
        say = printer or (lambda _line: None)
        say(f"CloudWatch logs: group {LOG_GROUP}, streams {self.name}/algo-<n>-<time>")
        start = time.monotonic()
        seen_transitions, seen_streams, last = 0, set(), None
        while True:
            info = self.describe()
            transitions = info.get("SecondaryStatusTransitions", [])
            for t in transitions[seen_transitions:]:
                say(f"{self.name}: {t['Status']} - {t.get('StatusMessage', '')}".rstrip(" -"))
            seen_transitions = len(transitions)
            status = (info["TrainingJobStatus"], info.get("SecondaryStatus"))
            if status != last:
                say(f"{self.name}: status {status[0]} ({status[1]})")
                last = status
            for stream in self.log_stream_names():
                if stream not in seen_streams:
                    seen_streams.add(stream)
                    say(f"{self.name}: log stream {LOG_GROUP}/{stream}")
            if status[0] in TERMINAL_STATUSES:
                if status[0] != "Completed":
                    raise TrainingJobFailed(
                        f"training job {self.name} ended {status[0]}: "
                        f"{info.get('FailureReason', 'no reason given')}"
                    )
                return status[0]
            if timeout is not None and time.monotonic() - start > timeout:
                say(f"{self.name}: still {status[0]} after {timeout:.0f} s; call wait() again to watch on")
                return status[0]
            time.sleep(poll)

    def stop(self) -> None:
        self.training_job.stop()
