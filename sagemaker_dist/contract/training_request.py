"""The CreateTrainingJob request, read once: every member a host, a platform or the launcher uses, as
typed fields. The request's raw keys are read here and nowhere else on the SDK side (the writer,
``launch.request``, and the rules, ``aws.request_validation``, aside), so a member SageMaker renames
or a default it changes is one edit, and every reader gets the same defaults.

A member of the wrong shape (a list where SageMaker takes an object, a count that is not a whole
number) is refused with its path in the request (``InputDataConfig[1].DataSource.S3DataSource.S3Uri``)
and what SageMaker expects there. What SageMaker would refuse beyond the shape is
``aws.request_validation``'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sagemaker_dist.errors import ConfigurationError

DEFAULT_INPUT_MODE = "File"  # AlgorithmSpecification.TrainingInputMode where the request names none
DEFAULT_DISTRIBUTION = "FullyReplicated"
MODEL_TARBALL = "model.tar.gz"
OUTPUT_TARBALL = "output.tar.gz"


class RequestFormatError(ConfigurationError):
    """A CreateTrainingJob request with a member of the wrong shape; names the member's path."""


def is_training_request(doc) -> bool:
    """Whether ``doc`` (a file's JSON) has the members that make it a CreateTrainingJob request and not
    another document (a tuning request, a manifest): an algorithm and input channels."""
    return isinstance(doc, Mapping) and "AlgorithmSpecification" in doc and "InputDataConfig" in doc


_ACCEPTED = {dict: Mapping, list: (list, tuple)}  # what a request built in Python holds as JSON's
_KINDS = {dict: "an object", list: "a list", str: "a string", int: "a whole number", bool: "true or false"}


def _member(doc: Mapping, path: str, key: str, kind: type, default, error):
    """``doc[key]`` checked to be a ``kind``; ``default`` where it is absent (or None)."""
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, _ACCEPTED.get(kind, kind)) or (kind is int and isinstance(value, bool)):
        raise error(
            f"{path}{key} is {type(value).__name__} {value!r:.60}, where SageMaker takes {_KINDS[kind]}; "
            "fix the request"
        )
    return value


def _section(request: Mapping, key: str, error) -> Mapping:
    return _member(request, "", key, dict, {}, error)


def _strings(request: Mapping, key: str, error) -> dict[str, str]:
    """A map of strings (HyperParameters, Environment): string keys; each value as its string."""
    doc = _section(request, key, error)
    for name in doc:
        if not isinstance(name, str):
            raise error(f"{key} has the key {name!r}, a {type(name).__name__}; SageMaker takes string keys")
    return {name: str(value) for name, value in doc.items()}


def _objects(doc: Mapping, path: str, key: str, error) -> tuple[dict, ...]:
    """A list of objects (MetricDefinitions, Tags), each copied."""
    items = _member(doc, path, key, list, [], error)
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise error(f"{path}{key}[{i}] is {type(item).__name__}, where SageMaker takes an object")
    return tuple(dict(item) for item in items)


_ALGORITHM, _CHECKPOINT, _STOPPING = "AlgorithmSpecification.", "CheckpointConfig.", "StoppingCondition."
_TENSORBOARD = "TensorBoardOutputConfig."


@dataclass
class ChannelSpec:
    """One InputDataConfig entry as a host serves it: its S3 source, how its objects are dealt to the
    hosts, and the mode its readers see (FastFile is served as File)."""

    name: str
    s3_uri: str
    data_type: str = "S3Prefix"
    distribution: str = DEFAULT_DISTRIBUTION
    record_wrapper: str = "None"
    shuffle_seed: int | None = None
    input_mode: str = "Pipe"
    content_type: str | None = None

    @classmethod
    def from_request(
        cls, channel: Mapping, default_mode: str = "Pipe", index: int = 0, error=RequestFormatError
    ) -> ChannelSpec:
        """The channel of InputDataConfig entry ``channel`` (the ``index``-th, for messages), in
        ``default_mode`` (AlgorithmSpecification.TrainingInputMode) unless it names its own."""
        where = f"InputDataConfig[{index}]."
        if not isinstance(channel, Mapping):
            raise error(f"{where[:-1]} is {type(channel).__name__}, where SageMaker takes an object")
        source = _member(channel, where, "DataSource", dict, {}, error)
        s3_where = f"{where}DataSource.S3DataSource."
        s3 = _member(source, f"{where}DataSource.", "S3DataSource", dict, {}, error)
        name, uri = (
            _member(channel, where, "ChannelName", str, None, error),
            _member(s3, s3_where, "S3Uri", str, None, error),
        )
        if name is None or uri is None:
            missing = f"{where}ChannelName" if name is None else f"{s3_where}S3Uri"
            raise error(f"{missing} is missing; every channel names itself and its S3 data")
        mode = _member(channel, where, "InputMode", str, None, error) or default_mode
        shuffle = _member(channel, where, "ShuffleConfig", dict, {}, error)
        return cls(
            name=name,
            s3_uri=uri,
            data_type=_member(s3, s3_where, "S3DataType", str, "S3Prefix", error),
            distribution=_member(s3, s3_where, "S3DataDistributionType", str, None, error)
            or _member(s3, s3_where, "S3DistributionType", str, DEFAULT_DISTRIBUTION, error),
            record_wrapper=_member(channel, where, "RecordWrapperType", str, None, error) or "None",
            shuffle_seed=_member(shuffle, f"{where}ShuffleConfig.", "Seed", int, None, error),
            input_mode="File" if mode == "FastFile" else mode,
            content_type=_member(channel, where, "ContentType", str, None, error),
        )


@dataclass(frozen=True, kw_only=True)
class TrainingRequest:
    """A CreateTrainingJob request's members, typed, with SageMaker's defaults where one is absent."""

    name: str
    image: str | None = None
    input_mode: str = DEFAULT_INPUT_MODE  # the channels' default (AlgorithmSpecification)
    metric_definitions: tuple[Mapping[str, str], ...] = ()  # SageMaker's {"Name", "Regex"} pairs
    hyperparameters: dict[str, str] = field(default_factory=dict)
    channels: tuple[ChannelSpec, ...] = ()
    hosts: int = 1  # ResourceConfig.InstanceCount
    instance_type: str | None = None
    output_path: str = ""  # OutputDataConfig.S3OutputPath without its trailing '/'; "" where none
    checkpoint_s3_uri: str | None = None
    checkpoint_local_path: str | None = None
    tensorboard_s3_uri: str | None = None
    tensorboard_local_path: str | None = None
    max_runtime: int | None = None  # StoppingCondition.MaxRuntimeInSeconds
    max_wait: int | None = None  # StoppingCondition.MaxWaitTimeInSeconds (spot)
    spot: bool = False
    environment: dict[str, str] = field(default_factory=dict)
    tags: tuple[Mapping[str, str], ...] = ()

    @classmethod
    def parse(cls, request, error=RequestFormatError) -> TrainingRequest:
        """``request`` (a CreateTrainingJob dict, as boto3 takes it) read once; ``error`` (a
        ``ConfigurationError``) names the first member of the wrong shape."""
        if not isinstance(request, Mapping):
            raise error(f"the request is a {type(request).__name__}, not a CreateTrainingJob dict")
        name = _member(request, "", "TrainingJobName", str, None, error)
        if not name:
            raise error("TrainingJobName is missing; every CreateTrainingJob request names its job")
        algorithm = _section(request, "AlgorithmSpecification", error)
        resources = _section(request, "ResourceConfig", error)
        stopping = _section(request, "StoppingCondition", error)
        checkpoint = _section(request, "CheckpointConfig", error)
        tensorboard = _section(request, "TensorBoardOutputConfig", error)
        output = _section(request, "OutputDataConfig", error)
        mode = _member(algorithm, _ALGORITHM, "TrainingInputMode", str, DEFAULT_INPUT_MODE, error)
        channels = _member(request, "", "InputDataConfig", list, [], error)
        return cls(
            name=name,
            image=_member(algorithm, _ALGORITHM, "TrainingImage", str, None, error),
            input_mode=mode,
            metric_definitions=_objects(algorithm, _ALGORITHM, "MetricDefinitions", error),
            hyperparameters=_strings(request, "HyperParameters", error),
            channels=tuple(ChannelSpec.from_request(c, mode, i, error) for i, c in enumerate(channels)),
            hosts=_member(resources, "ResourceConfig.", "InstanceCount", int, 1, error),
            instance_type=_member(resources, "ResourceConfig.", "InstanceType", str, None, error),
            output_path=_member(output, "OutputDataConfig.", "S3OutputPath", str, "", error).rstrip("/"),
            checkpoint_s3_uri=_member(checkpoint, _CHECKPOINT, "S3Uri", str, None, error),
            checkpoint_local_path=_member(checkpoint, _CHECKPOINT, "LocalPath", str, None, error),
            tensorboard_s3_uri=_member(tensorboard, _TENSORBOARD, "S3OutputPath", str, None, error),
            tensorboard_local_path=_member(tensorboard, _TENSORBOARD, "LocalPath", str, None, error),
            max_runtime=_member(stopping, _STOPPING, "MaxRuntimeInSeconds", int, None, error),
            max_wait=_member(stopping, _STOPPING, "MaxWaitTimeInSeconds", int, None, error),
            spot=_member(request, "", "EnableManagedSpotTraining", bool, False, error),
            environment=_strings(request, "Environment", error),
            tags=_objects(request, "", "Tags", error),
        )

    @property
    def container_variables(self) -> dict[str, str]:
        """What SageMaker sets in each of the job's containers from the request (``container_variables``)."""
        return container_variables(self.name, self.environment)

    def output_uri(self, tarball: str) -> str | None:
        """Where SageMaker puts ``tarball`` (``MODEL_TARBALL``, ``OUTPUT_TARBALL``) after the job; None
        without an output path."""
        return f"{self.output_path}/{self.name}/output/{tarball}" if self.output_path else None


def input_data_config(channels: Iterable[ChannelSpec]) -> dict[str, dict]:
    """inputdataconfig.json for the request's channels (FastFile shows as File)."""
    doc = {}
    for ch in channels:
        entry = {
            "TrainingInputMode": ch.input_mode,
            "S3DistributionType": ch.distribution,
            "RecordWrapperType": ch.record_wrapper,
        }
        if ch.content_type:
            entry["ContentType"] = ch.content_type
        doc[ch.name] = entry
    return doc


def container_variables(job_name: str, environment: Mapping | None) -> dict[str, str]:
    """The variables SageMaker sets in a job's containers from its request: the ``Environment`` map,
    then ``TRAINING_JOB_NAME`` (the platform's: an ``Environment`` entry does not replace it)."""
    return {**{str(k): str(v) for k, v in (environment or {}).items()}, "TRAINING_JOB_NAME": job_name}


def edited_request(
    request: Mapping,
    *,
    instance_type: str | None = None,
    checkpoint_s3_uri: str | None = None,
    hyperparameters: Mapping[str, str] | None = None,
    without_hyperparameters: Iterable[str] = (),
) -> dict:
    """A copy of ``request`` with what is given changed (``instance_type``, ``checkpoint_s3_uri``,
    ``hyperparameters`` set over its own) and ``without_hyperparameters`` dropped: a caller's overrides
    of a request it was handed, written where the request's members are named."""
    edited = dict(request)
    if instance_type:
        edited["ResourceConfig"] = {**(request.get("ResourceConfig") or {}), "InstanceType": instance_type}
    if checkpoint_s3_uri:
        edited["CheckpointConfig"] = {**(request.get("CheckpointConfig") or {}), "S3Uri": checkpoint_s3_uri}
    dropped = set(without_hyperparameters)
    if dropped or hyperparameters:
        hps = {**(request.get("HyperParameters") or {}), **(hyperparameters or {})}
        edited["HyperParameters"] = {k: v for k, v in hps.items() if k not in dropped}
    return edited


# CreateTrainingJob members a tuning job's HyperParameterTrainingJobDefinition carries as they are
DEFINITION_MEMBERS = (
    "RoleArn", "InputDataConfig", "VpcConfig", "OutputDataConfig", "ResourceConfig", "StoppingCondition",
    "EnableNetworkIsolation", "EnableInterContainerTrafficEncryption", "EnableManagedSpotTraining",
    "RetryStrategy", "Environment",
)  # fmt: skip


def training_definition(request: Mapping, static_hyperparameters: Mapping, metric_definitions: list) -> dict:
    """The HyperParameterTrainingJobDefinition of a tuning job over ``request``: the members a definition
    carries, its image and input mode, ``static_hyperparameters`` and the tuning's ``metric_definitions``.
    CheckpointConfig and TensorBoardOutputConfig have no place in it."""
    algorithm = _section(request, "AlgorithmSpecification", RequestFormatError)
    definition = {
        "StaticHyperParameters": dict(static_hyperparameters),
        "AlgorithmSpecification": {
            "TrainingImage": algorithm.get("TrainingImage"),
            "TrainingInputMode": algorithm.get("TrainingInputMode"),
            "MetricDefinitions": metric_definitions,
        },
    }
    return {**definition, **{k: request[k] for k in DEFINITION_MEMBERS if k in request}}


def trial_request(tuning_request: Mapping, job_name: str, hyperparameters: Mapping) -> dict:
    """The CreateTrainingJob request SageMaker makes for one trial of ``tuning_request``: its training
    definition's members and tags, with the static hyperparameters, then ``hyperparameters``."""
    definition = _section(tuning_request, "TrainingJobDefinition", RequestFormatError)
    algorithm = _section(definition, "AlgorithmSpecification", RequestFormatError)
    request = {
        "TrainingJobName": job_name,
        "AlgorithmSpecification": {k: algorithm[k] for k in _TRIAL_ALGORITHM if k in algorithm},
        "HyperParameters": {**(definition.get("StaticHyperParameters") or {}), **hyperparameters},
    }
    request.update({k: definition[k] for k in DEFINITION_MEMBERS if k in definition})
    if tuning_request.get("Tags"):
        request["Tags"] = list(tuning_request["Tags"])
    return request


_TRIAL_ALGORITHM = ("TrainingImage", "TrainingInputMode", "MetricDefinitions")


def request_from_json(text: str, where: str, error=RequestFormatError) -> dict:
    """The CreateTrainingJob request in ``text``, the JSON of ``where`` (a file, an S3 URI); ``error``
    names ``where`` when it is not JSON or not such a request."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise error(f"{where} is not valid JSON: {exc}") from exc
    if not is_training_request(doc):
        kind = "object" if isinstance(doc, Mapping) else type(doc).__name__
        raise error(
            f"{where} is not a CreateTrainingJob request: it holds a JSON {kind}, and a request is an object "
            "with AlgorithmSpecification, HyperParameters and InputDataConfig; write one with "
            "'sagemaker-dist launch ... --dry-run' or DistributedEstimator.prepare(...).request"
        )
    return dict(doc)
