"""Training image URIs: our container in the user's ECR, and the AWS DLC TensorFlow image it builds on."""

from __future__ import annotations

import re

import boto3

from sagemaker_dist import __version__
from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.errors import ConfigurationError

DEFAULT_REPOSITORY = "sagemaker-dist"
DLC_TF_VERSION = "2.14"  # the container's base: the newest DLC with TF <= 2.15 (Keras 2, Horovod)
DLC_PY_VERSION = "py310"
_ACCOUNT_RE = re.compile(r"^\d{12}$")
_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_REPO_RE = re.compile(r"^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*$")


class ImageError(ConfigurationError):
    """An image URI that cannot be formed from the given account, region or repository."""


def ecr_domain(region: str) -> str:
    """ECR's DNS suffix for ``region`` (China regions use amazonaws.com.cn)."""
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def _region(region: str | None) -> str:
    if region is None:
        region = boto3.session.Session().region_name
    if not region or not _REGION_RE.match(region):
        raise ImageError(f"region {region!r} is not an AWS region name; pass region='us-east-1' or similar")
    return region


def _account(account: str | None) -> str:
    if account is None:
        account = boto3.client("sts").get_caller_identity()["Account"]
    account = str(account)
    if not _ACCOUNT_RE.match(account):
        raise ImageError(f"account {account!r} is not a 12-digit AWS account id")
    return account


def container_image_uri(
    region: str | None = None,
    account: str | None = None,
    repository: str = DEFAULT_REPOSITORY,
    tag: str = __version__,
) -> str:
    """URI of the sagemaker-dist container pushed by ``container/build_and_push.sh`` to your ECR.

    ``region`` defaults to the boto3 session's; ``account`` to the caller's (one STS call).
    """
    if not _REPO_RE.match(repository):
        raise ImageError(f"repository {repository!r} is not a valid ECR repository name")
    if not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", tag):
        raise ImageError(f"tag {tag!r} is not a valid image tag")
    region = _region(region)
    return f"{_account(account)}.dkr.ecr.{region}.{ecr_domain(region)}/{repository}:{tag}"


def dlc_tensorflow_image_uri(
    region: str | None = None,
    instance_type: str = "ml.p3.16xlarge",
    version: str = DLC_TF_VERSION,
    py_version: str = DLC_PY_VERSION,
) -> str:
    """The AWS Deep Learning Container TensorFlow training image, from ``sagemaker.core.image_uris``.

    For comparison with our image (and as the base it builds on): a GPU or CPU tag by instance type.
    """
    return dlc_image_uri("tensorflow", region, instance_type, version, py_version)


def dlc_image_uri(
    framework: str, region: str | None, instance_type: str, version: str, py_version: str
) -> str:
    """An AWS Deep Learning Container training image of ``framework``: a GPU or CPU tag by instance type."""
    from sagemaker.core import image_uris

    try:
        return image_uris.retrieve(
            framework=framework,
            region=_region(region),
            version=version,
            py_version=py_version,
            instance_type=instance_type,
            image_scope="training",
        )
    except ValueError as exc:
        title = {"tensorflow": "TensorFlow", "pytorch": "PyTorch"}.get(framework, framework)
        raise ImageError(
            f"no AWS {title} training image for {version}/{py_version}/{instance_type}: {exc}"
        ) from exc


def distribution_image_uri(
    name: str, region: str | None, instance_type: str, account: str | None = None
) -> str:
    """The image a job of distribution ``name`` runs in when no image is given (its registry entry's
    ``image``): an AWS DLC as is (e.g. the current TensorFlow one: no Horovod needed), or our
    container in the caller's ECR (``sagemaker-dist``, ``sagemaker-dist-pytorch``)."""
    entry = distribution(name)
    if entry.image is None:
        return container_image_uri(region=region, account=account, repository=entry.repository)
    dlc = entry.image
    return dlc_image_uri(dlc.framework, region, instance_type, dlc.version, dlc.py_version)
