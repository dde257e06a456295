"""``sagemaker_dist.host`` serves local mode and the platforms' pipe agent alike: it reads a request
into host trees one way for both, and keeps none of local mode's own vocabulary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import sagemaker_dist
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.host.opt_ml import DEFAULT_INSTANCE_TYPE, host_trees_for
from sagemaker_dist.local.demo import prepare_demo_job

PACKAGE = Path(sagemaker_dist.__file__).parent


def test_one_reading_of_a_request_into_host_trees(s3, bucket, tmp_path):
    request = prepare_demo_job(bucket, 2, 1, printer=None).request
    request["ResourceConfig"]["InstanceType"] = "ml.p4d.24xlarge"
    request["Environment"] = {"FROM_THE_REQUEST": "1"}
    trees = host_trees_for(JobSpec.from_request(request), tmp_path)
    assert [t.name for t in trees] == ["algo-1", "algo-2"]
    resource = json.loads((trees[1].config_dir / "resourceconfig.json").read_text())
    assert (resource["current_host"], resource["current_instance_type"]) == ("algo-2", "ml.p4d.24xlarge")
    assert (
        trees[1].env["FROM_THE_REQUEST"] == "1"
        and trees[1].env["TRAINING_JOB_NAME"] == request["TrainingJobName"]
    )
    assert DEFAULT_INSTANCE_TYPE == "local"


def test_both_users_build_trees_through_it():
    """Local mode and the pipe agent both build their host trees through it, not each its own reading."""
    for user in ("local/job.py", "platforms/pipe_agent.py"):
        source = (PACKAGE / user).read_text()
        assert "host_trees_for(" in source and "build_host_trees(" not in source, user


def test_local_modes_own_names_stay_in_local():
    """The rank entry's job-file variable is local mode's: defined once, in local/, not in host/."""
    defined = [
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if '"SAGEMAKER_DIST_LOCAL_JOB"' in p.read_text()
    ]
    assert defined == ["local/rank_entry.py"]


def test_host_speaks_of_hosts_not_of_an_emulator():
    """Its feeding runs for real on Slurm and Kubernetes nodes: 'simulated' only where local mode is named."""
    for path in sorted((PACKAGE / "host").glob("*.py")):
        text = re.sub(r"\s+", " ", path.read_text())
        assert "emulat" not in text.lower(), path.name
        for match in re.finditer(r"simulated", text, re.IGNORECASE):
            assert text[max(0, match.start() - 13) : match.start()].lower() == "local mode's ", path.name
