"""The registry of distributions: each entry's rules, and the names the rest of the package asks of it
instead of branching on a distribution's name."""

from __future__ import annotations

import dataclasses

import pytest

from sagemaker_dist.contract import distributions as reg
from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.layout import DISTRIBUTIONS, HOROVOD, TF_MWMS, LayoutError, plan_layout
from sagemaker_dist.contract.rank_slots import RANK_VARIABLES
from sagemaker_dist.local import launchers


def test_the_registry_holds_horovod_then_tf_mwms_then_torchrun_and_the_layout_keeps_its_names():
    assert reg.NAMES == DISTRIBUTIONS == ("horovod", "tf-mwms", "torchrun")
    assert (HOROVOD, TF_MWMS, reg.DEFAULT) == ("horovod", "tf-mwms", "horovod")
    assert reg.distribution(None) is reg.distribution("horovod") is reg.HOROVOD_ENTRY
    for entry in reg.REGISTRY.values():
        assert entry.framework == ("pytorch" if entry.name == "torchrun" else "tensorflow")
        with pytest.raises(dataclasses.FrozenInstanceError):
            entry.name = "other"


def test_an_unknown_name_is_refused_naming_the_registered_ones():
    with pytest.raises(
        reg.DistributionError, match="distribution='mwms'; use one of horovod, tf-mwms, torchrun"
    ):
        reg.distribution("mwms")
    assert not reg.is_registered("mwms") and not reg.is_registered(None) and reg.is_registered("tf-mwms")


def test_processes_per_host_per_gpu_or_one_per_host():
    horovod, mwms = reg.distribution("horovod"), reg.distribution("tf-mwms")
    assert (horovod.processes_per_host, horovod.default_processes_per_host()) == (reg.PER_GPU, None)
    assert (mwms.processes_per_host, mwms.default_processes_per_host()) == (reg.ONE_PER_HOST, 1)
    horovod.check_processes_per_host(8)
    mwms.check_processes_per_host(1)
    with pytest.raises(reg.DistributionError, match="must be 1, not 8; .* use distribution 'horovod'"):
        mwms.check_processes_per_host(8)
    with pytest.raises(LayoutError, match="must be 1, not 2"):  # the layout's error, as before
        plan_layout(2, 2, distribution="tf-mwms")


def test_the_hyperparameters_the_toolkit_reads():
    assert reg.distribution("horovod").toolkit_hyperparameters(4, "-x A=1") == {
        hp.MPI_ENABLED: "true",
        hp.MPI_PROCESSES_PER_HOST: "4",
        hp.MPI_CUSTOM_OPTIONS: "-x A=1",
    }
    assert reg.distribution("tf-mwms").toolkit_hyperparameters(1, "-x A=1") == {hp.MWMS_ENABLED: "true"}
    # sagemaker-training's TorchDistributedRunner takes --nproc_per_node from the MPI count; no mpirun
    assert reg.distribution("torchrun").toolkit_hyperparameters(4, "-x A=1") == {
        "sagemaker_torch_distributed_enabled": "true",
        hp.MPI_PROCESSES_PER_HOST: "4",
    }


def test_rank_environment_image_platforms_and_helper():
    horovod, mwms = reg.distribution("horovod"), reg.distribution("tf-mwms")
    assert horovod.rank_variables == RANK_VARIABLES
    assert mwms.rank_variables == (("TF_CONFIG",),)
    assert reg.rank_markers() == ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "TF_CONFIG", "RANK")
    assert horovod.image is None  # our container
    assert mwms.image == reg.DlcImage("tensorflow", "2.21", "py312")
    assert (horovod.kubernetes, mwms.kubernetes, mwms.slurm) == ("MPIJob", None, None)
    assert (horovod.mpi, mwms.mpi) == (True, False)
    assert horovod.keras_helper.endswith("horovod_keras") and mwms.keras_helper.endswith("mwms_keras")


@pytest.mark.parametrize(("name", "asked", "runs"), [
    ("horovod", "horovodrun", "horovodrun"),
    ("horovod", "mpirun", "mpirun"),
    ("horovod", "toolkit", "toolkit"),
    ("horovod", "container", "container"),
    ("tf-mwms", "horovodrun", "tf-config"),  # the launcher a job gets when none is named
    ("tf-mwms", "toolkit", "toolkit"),
    ("tf-mwms", "container", "container"),
    ("torchrun", "horovodrun", "torchrun"),
    ("torchrun", "torchrun", "torchrun"),
])  # fmt: skip
def test_the_local_launcher_of_each_distribution(name, asked, runs):
    assert reg.distribution(name).local_launcher(asked) == runs


def test_mpirun_is_refused_for_tf_mwms_naming_what_runs_it():
    with pytest.raises(reg.DistributionError, match="launcher 'mpirun' is for Horovod jobs.*'toolkit'"):
        reg.distribution("tf-mwms").local_launcher("mpirun")


def test_every_launcher_an_entry_names_is_one_local_mode_has():
    known = {launchers.TF_CONFIG, launchers.TORCHRUN, *launchers.LAUNCHERS}
    assert {launchers.HOROVODRUN, launchers.MPIRUN, launchers.TOOLKIT, launchers.CONTAINER} <= known
    for entry in reg.REGISTRY.values():
        assert set(entry.local_launchers) <= known, entry.name
        assert entry.default_launcher == entry.local_launchers[0]


def test_torchrun_one_process_per_gpu_the_pytorch_dlc_and_gpu_types_on_sagemaker():
    torchrun = reg.distribution("torchrun")
    assert (torchrun.processes_per_host, torchrun.default_processes_per_host()) == (reg.PER_GPU, None)
    assert torchrun.rank_variables == (("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),)
    assert (torchrun.image, torchrun.repository) == (None, "sagemaker-dist-pytorch")  # build_and_push.sh
    assert (torchrun.mpi, torchrun.kubernetes, torchrun.keras_helper) == (False, "TrainJob", None)
    assert torchrun.demo_script == "train_torch.py"
    for ok in ("ml.p4d.24xlarge", "ml.g5.12xlarge", "ml.trn1.32xlarge", "G6.48XLARGE"):
        torchrun.check_sagemaker_instance_type(ok)
    with pytest.raises(reg.DistributionError, match="not 'ml.c5.xlarge'.*sagemaker-dist local"):
        torchrun.check_sagemaker_instance_type("ml.c5.xlarge")
    reg.distribution("horovod").check_sagemaker_instance_type("ml.c5.xlarge")  # any type
    with pytest.raises(reg.DistributionError, match="launcher 'mpirun' is for Horovod jobs"):
        torchrun.local_launcher("mpirun")
