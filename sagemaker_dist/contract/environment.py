"""The environment variables sagemaker-dist's SDK side reads (the CLI, the launcher, local mode, the
hosts, the platforms), each named once with what it means, and read only through this module: no
other module of those wings touches ``os.environ``. An accessor reads this process's environment, or
``env``, the environment a child process will get (a launcher checks the S3 endpoint its hosts will
see). Handing the whole environment on to a child (``inherited``) reads no variable by name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENDPOINT_URL = "AWS_ENDPOINT_URL"  # the S3 (and SageMaker) endpoint boto3 uses; the CLI sets it
S3_ENDPOINT_NAMES = ("AWS_ENDPOINT_URL_S3", ENDPOINT_URL)  # botocore's precedence for S3
CONTAINER_PYTHON = "SAGEMAKER_DIST_CONTAINER_PYTHON"  # the image's Python, for the toolkit launcher
CACHE_HOME = "XDG_CACHE_HOME"  # where the embedded S3 endpoint keeps its state
SLURM_CONF = "SLURM_CONF"  # the cluster's slurm.conf, for sbatch and scontrol
SEARCH_PATH = "PATH"
HOME = "HOME"


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def inherited() -> dict[str, str]:
    """This process's environment, copied: what a child process starts from."""
    return dict(os.environ)


def variable(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable ``name`` (None where unset or empty), for names another module defines with their
    meaning: local mode's job file for a rank's entry, the rank variables a launcher sets."""
    return _env(env).get(name) or None


def set_variables(values: Mapping[str, str | None]) -> dict[str, str | None]:
    """Set ``values`` in this process's environment (None: unset it), for the boto3 clients and the
    children it starts after; returns what they were, for ``set_variables`` to restore."""
    before = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return before


def endpoint_url(env: Mapping[str, str] | None = None) -> str | None:
    """``$AWS_ENDPOINT_URL``: another S3 endpoint than AWS's (the embedded one, MinIO), or None."""
    return variable(ENDPOINT_URL, env)


def s3_endpoint(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable name, URL) of the S3 endpoint ``env`` names, by botocore's precedence; None for AWS's."""
    return next(((name, _env(env)[name]) for name in S3_ENDPOINT_NAMES if variable(name, env)), None)


def container_python(env: Mapping[str, str] | None = None) -> Path | None:
    """``$SAGEMAKER_DIST_CONTAINER_PYTHON``: the Python of an environment like the image's, or None."""
    value = variable(CONTAINER_PYTHON, env)
    return Path(value) if value else None


def cache_home(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache``."""
    return Path(variable(CACHE_HOME, env) or Path.home() / ".cache")


def search_path(env: Mapping[str, str] | None = None) -> str:
    """``$PATH``, else the system's default search path."""
    return variable(SEARCH_PATH, env) or os.defpath


def slurm_conf(env: Mapping[str, str] | None = None) -> str | None:
    """``$SLURM_CONF``: the cluster's slurm.conf, or None."""
    return variable(SLURM_CONF, env)


def home(env: Mapping[str, str] | None = None) -> str:
    """``$HOME`` as a shell expands ``~`` (``~`` itself where unset)."""
    return _env(env).get(HOME, "~")
