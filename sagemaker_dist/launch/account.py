"""The estimator's AWS edges: role ARNs, the job-name check, CreateTrainingJob, AWS errors as ours."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from sagemaker_dist.contract.training_request import TrainingRequest
from sagemaker_dist.errors import AwsError
from sagemaker_dist.launch.inputs import EstimatorError


class AwsRequestError(AwsError):
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
        try:
            account = sts.get_caller_identity()["Account"]
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(
                exc,
                f"look up the AWS account for role name {role!r} (sts:GetCallerIdentity)",
                "pass the role as a full ARN (arn:aws:iam::<account>:role/<name>) or fix the credentials",
            ) from exc
    partition = (
        "aws-cn"
        if (region or "").startswith("cn-")
        else ("aws-us-gov" if (region or "").startswith("us-gov-") else "aws")
    )
    return f"arn:{partition}:iam::{account}:role/{role.lstrip('/')}"


def existing(describe: Callable[[], dict], what: str, permission: str) -> dict | None:
    """What ``describe()`` returns, or None where SageMaker says there is no such resource: the check
    that a name is free, made before anything is written to S3 (other errors name ``permission``)."""
    try:
        return describe()
    except ClientError as exc:
        if _is_not_found(exc):
            return None
        raise aws_error(
            exc,
            what,
            f"the name must be checked before anything is written to S3: allow {permission} for these "
            "credentials",
        ) from exc
    except BotoCoreError as exc:
        raise aws_error(exc, what, "") from exc


def check_job_name_free(job_name: str, boto_session=None) -> None:
    """Raise EstimatorError if a training job called ``job_name`` exists (DescribeTrainingJob).

    CreateTrainingJob refuses a name in use only after prepare() wrote the shards and the source
    under ``<output_path>/<job_name>/``, overwriting those of the job that has the name.
    """
    client = (boto_session or boto3.Session()).client("sagemaker")  # honours AWS_ENDPOINT_URL
    job = existing(
        lambda: client.describe_training_job(TrainingJobName=job_name),
        f"describe training job {job_name!r}",
        "sagemaker:DescribeTrainingJob",
    )
    if job is None:
        return
    raise EstimatorError(
        f"a training job named {job_name!r} already exists (status {job.get('TrainingJobStatus')}); "
        "job names are unique per account and region: pass another job_name= (CLI: --job-name), or "
        "leave it out for a time-stamped name"
    )


# What sagemaker.core's TrainingJob.create fills in from the SageMaker config files
# (SageMaker.PythonSDK.Resources.TrainingJob / GlobalDefaults) when the request leaves it unset.
SDK_CONFIGURABLE_ATTRIBUTES = (
    "role_arn",
    "output_data_config",
    "resource_config",
    "vpc_config",
    "checkpoint_config",
    "debug_hook_config",
    "tensor_board_output_config",
    "profiler_config",
)


def with_sdk_config_defaults(request: Mapping) -> tuple[dict, list[str]]:
    """The request as ``TrainingJob.create`` will send it, SageMaker config-file defaults merged in,
    and the request fields those defaults added. Merging here lets validation see the final request."""
    from sagemaker.core.resources import Base
    from sagemaker.core.utils.code_injection.codec import transform
    from sagemaker.core.utils.utils import serialize, snake_to_pascal

    kwargs = transform(dict(request), "CreateTrainingJobRequest")
    schema = {name: {} for name in SDK_CONFIGURABLE_ATTRIBUTES}
    merged = Base.get_updated_kwargs_with_configured_attributes(schema, "TrainingJob", **dict(kwargs))
    added = [k for k in SDK_CONFIGURABLE_ATTRIBUTES if kwargs.get(k) is None and merged.get(k) is not None]
    out = dict(request)
    for name in added:
        out[snake_to_pascal(name)] = serialize(merged[name])
    return out, [snake_to_pascal(name) for name in added]


def create_with_sdk(resource, shape: str, request: Mapping, what: str, hint: str, boto_session=None):
    """``resource.create`` of SDK v3 for a request in boto3's shape, AWS errors as ours naming ``what``."""
    from sagemaker.core.utils.code_injection.codec import transform

    boto_session = boto_session or boto3.Session()
    try:
        return resource.create(
            **transform(dict(request), shape), session=boto_session, region=boto_session.region_name
        )
    except (ClientError, BotoCoreError) as exc:
        raise aws_error(exc, what, hint) from exc


def create_training_job(request: Mapping, boto_session=None):
    """CreateTrainingJob through SDK v3: ``sagemaker.core.resources.TrainingJob.create``."""
    from sagemaker.core.resources import TrainingJob

    return create_with_sdk(
        TrainingJob,
        "CreateTrainingJobRequest",
        request,
        f"create training job {TrainingRequest.parse(request).name!r}",
        "no job was created; fix what the message names (role, limits, quotas, image, S3 access) "
        "and launch again with another job_name (the shards and source of this attempt are "
        "already in S3 under its name)",
        boto_session,
    )


def sdk_channels(request: Mapping) -> list:
    """The request's channels as ``sagemaker.core.shapes.Channel`` objects, for SDK v3 users."""
    from sagemaker.core.shapes import Channel
    from sagemaker.core.utils.code_injection.codec import transform

    members = transform(dict(request), "CreateTrainingJobRequest")  # the SDK's own reading of the request
    return [Channel(**channel) for channel in members.get("input_data_config", [])]
