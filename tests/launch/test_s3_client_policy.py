"""Every S3 client of ours is built with contract's one retry and timeout policy (``s3_client_settings``).

Checked twice: each factory's client carries the policy, and no ``client("s3")`` in the package is
built outside the two factories (the SDK and host side's, and the container's, which may not import ``aws``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

import sagemaker_dist
from sagemaker_dist.contract.s3_uri import S3_CONNECT_TIMEOUT_S, S3_READ_TIMEOUT_S, s3_client_settings

PACKAGE = Path(sagemaker_dist.__file__).parent
# (path under sagemaker_dist/, function): the only places an S3 client is built
FACTORIES = {("aws/s3_objects.py", "s3_client"), ("runtime/s3_mirror.py", "s3_client")}


def _policy_retries() -> dict:
    """``retries`` as botocore reports it for a client built with the policy."""
    client = boto3.client("s3", region_name="us-east-1", config=Config(**s3_client_settings()))
    return client.meta.config.retries


def _launch_client():
    from sagemaker_dist.aws.s3_objects import s3_client

    return s3_client()


def _local_endpoint_client():
    from sagemaker_dist.local.endpoint import _local_client

    return _local_client("http://127.0.0.1:9")


def _estimator_client(tmp_path):
    from sagemaker_dist.launch.estimator import DistributedEstimator

    (tmp_path / "train.py").write_text("print('hi')\n")
    role = "arn:aws:iam::123456789012:role/SageMakerRole"
    script = str(tmp_path / "train.py")
    estimator = DistributedEstimator(script, role, "ml.c5.4xlarge", 1, processes_per_host=1)
    return estimator._s3_client()


def _runtime_client():
    from sagemaker_dist.runtime.s3_mirror import s3_client

    return s3_client()


FACTORY_CLIENTS = [_launch_client, _local_endpoint_client, _estimator_client, _runtime_client]


@pytest.mark.parametrize("factory", FACTORY_CLIENTS)
def test_each_factory_builds_its_clients_with_the_policy(factory, aws_env, tmp_path):
    client = factory(tmp_path) if factory is _estimator_client else factory()
    config = client.meta.config
    assert config.retries == _policy_retries()
    assert (config.connect_timeout, config.read_timeout) == (S3_CONNECT_TIMEOUT_S, S3_READ_TIMEOUT_S)


def test_the_copy_client_tunes_the_policy_without_leaving_it(aws_env):
    from sagemaker_dist.aws.s3_objects import make_client

    config = make_client(max_pool_connections=40).meta.config
    assert config.retries["mode"] == "standard" and config.retries["total_max_attempts"] == 11
    assert (config.connect_timeout, config.read_timeout, config.max_pool_connections) == (
        S3_CONNECT_TIMEOUT_S,
        120,
        40,
    )


def test_the_factory_honours_a_session_and_an_endpoint(aws_env, moto_server, bucket):
    from sagemaker_dist.aws.s3_objects import s3_client

    session = boto3.session.Session(region_name="eu-west-1")
    client = s3_client(session=session, endpoint_url=moto_server)
    assert client.meta.region_name == "eu-west-1" and client.meta.endpoint_url == moto_server
    client.put_object(Bucket=bucket, Key="k", Body=b"v")
    assert s3_client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"  # AWS_ENDPOINT_URL


def test_the_source_upload_defaults_to_the_policy_client(aws_env, bucket, tmp_path):
    """``upload_source`` without a client builds one from the factory, not a plain boto3 client."""
    from sagemaker_dist.launch.source_package import TARBALL_NAME, pack_source, upload_source

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    package = pack_source("train.py", tmp_path / "src", dest_dir=tmp_path / "out")
    uri = f"s3://{bucket}/job/source/{TARBALL_NAME}"
    assert upload_source(package, uri) == uri
    head = boto3.client("s3").head_object(Bucket=bucket, Key=f"job/source/{TARBALL_NAME}")
    assert head["Metadata"]["sha256"] == package.sha256


def _s3_client_calls(source: str) -> list[tuple[str | None, int]]:
    """(enclosing function, line) of each call that builds an S3 client: ``*client("s3")``,
    ``*resource("s3")`` or ``service_name="s3"``."""
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                args = list(child.args[:1]) + [k.value for k in child.keywords if k.arg == "service_name"]
                if name.endswith(("client", "resource")) and any(
                    isinstance(a, ast.Constant) and a.value == "s3" for a in args
                ):
                    found.append((function, child.lineno))
            visit(child, inner)

    visit(ast.parse(source), None)
    return found


def test_no_s3_client_is_built_outside_the_factories():
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for function, line in _s3_client_calls(path.read_text()):
            if (rel, function) not in FACTORIES:
                stray.append(f"sagemaker_dist/{rel}:{line} (in {function})")
    assert stray == [], "build S3 clients with launch.s3_objects.s3_client (the one policy)"


def test_the_check_catches_a_plain_client():
    source = (
        "import boto3\n"
        "def upload():\n    return boto3.client('s3')\n"
        "def other(session):\n    return session.client(service_name='s3')\n"
        "def fine(session):\n    return session.client('sagemaker')\n"
    )
    assert _s3_client_calls(source) == [("upload", 3), ("other", 5)]
