"""Launcher name -> its implementation of ``base.Launcher``: the one place local mode turns a launcher's
name into code. Which launchers run a distribution, and its default, is the registry's
(``contract/distributions.py``); a new launcher is a ``Launcher`` subclass whose ``name`` is in the
registry, listed here.
"""

from __future__ import annotations

from collections.abc import Mapping

from sagemaker_dist.contract.distributions import DistributionError, distribution
from sagemaker_dist.local.launchers.base import Launcher, LocalJobError
from sagemaker_dist.local.launchers.entry_ranks import Horovodrun, Mpirun, TfConfig, Torchrun
from sagemaker_dist.local.launchers.mpi import LaunchError
from sagemaker_dist.local.launchers.toolkit_hosts import Container, Toolkit

IMPLEMENTATIONS: Mapping[str, type[Launcher]] = {
    launcher.name: launcher for launcher in (Horovodrun, Mpirun, Toolkit, Container, TfConfig, Torchrun)
}


def launcher_class(name: str) -> type[Launcher]:
    """The implementation of the launcher ``name`` (one of the registry's launcher names)."""
    try:
        return IMPLEMENTATIONS[name]
    except KeyError:
        raise LaunchError(f"launcher {name!r} is not one of {', '.join(IMPLEMENTATIONS)}") from None


def launcher_for(distribution_name: str, asked: str) -> type[Launcher]:
    """The launcher that runs a job of ``distribution_name`` when ``asked`` is asked for: the one its
    registry entry names (e.g. a tf-mwms job runs one worker per host with TF_CONFIG where no launcher
    is named)."""
    try:
        name = distribution(distribution_name).local_launcher(asked)
    except DistributionError as exc:
        raise LocalJobError(str(exc)) from None
    return launcher_class(name)
