"""runtime/environment.py: the variables the ranks read, each as its reader expects it (the mapping given
else the process's, empty kept apart from unset where that means something)."""

from __future__ import annotations

from sagemaker_dist.runtime import environment


def test_environ_is_the_mapping_given_else_this_process_environment(monkeypatch):
    monkeypatch.setenv("SAGEMAKER_DIST_TEST_VARIABLE", "live")
    assert environment.environ()["SAGEMAKER_DIST_TEST_VARIABLE"] == "live"
    given = {"RANK": "3"}
    assert environment.environ(given) is given
    assert environment.torch_rank(given) == "3"
    assert environment.variable("RANK", {"RANK": ""}) is None


def test_an_empty_cuda_visible_devices_hides_every_gpu_and_is_kept(monkeypatch):
    monkeypatch.setenv(environment.CUDA_VISIBLE_DEVICES, "")
    assert environment.cuda_visible_devices() == ""
    monkeypatch.delenv(environment.CUDA_VISIBLE_DEVICES)
    assert environment.cuda_visible_devices() is None


def test_aws_region_and_s3_endpoint_take_boto3s_precedence(monkeypatch):
    for name in (*environment.REGION_NAMES, *environment.S3_ENDPOINT_NAMES):
        monkeypatch.delenv(name, raising=False)
    assert environment.aws_region() is None and environment.s3_endpoint_url() is None
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_REGION", "")
    assert environment.aws_region() == "eu-west-1"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert environment.aws_region() == "us-west-2"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://general:9000")
    assert environment.s3_endpoint_url() == "http://general:9000"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:9000")
    assert environment.s3_endpoint_url() == "http://s3-only:9000"


def test_settings_are_read_stripped(monkeypatch):
    monkeypatch.setenv(environment.COLLECTIVE_TIMEOUT, " 60 ")
    monkeypatch.delenv(environment.STOP_GRACE, raising=False)
    monkeypatch.setenv(environment.READER, " Python ")
    assert environment.collective_timeout() == "60"
    assert environment.stop_grace() == ""
    assert environment.stop_grace({environment.STOP_GRACE: " 5"}) == "5"
    assert environment.reader() == "python"
    monkeypatch.setenv(environment.READER, " ")
    assert environment.reader() == "auto"


def test_set_variable_sets_this_process_environment(monkeypatch):
    monkeypatch.setenv("SAGEMAKER_DIST_TEST_VARIABLE", "auto")  # restored as it was after the test
    environment.set_variable("SAGEMAKER_DIST_TEST_VARIABLE", "compiled")
    assert environment.variable("SAGEMAKER_DIST_TEST_VARIABLE") == "compiled"
