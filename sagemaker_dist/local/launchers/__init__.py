"""How local mode starts a job's ranks: one vocabulary, one module per launcher.

- ``horovodrun`` and ``mpirun`` (``mpi``): every rank on this machine, started by Horovod's or Open
  MPI's launcher, each entering its simulated host through ``sagemaker_dist.local.rank_entry``;
- ``toolkit`` (``toolkit``, with ``toolkit_host``): AWS's sagemaker-training entry point runs each
  simulated host in a namespace of its own and starts the ranks itself, as in the DLC;
- ``container`` (``container``): the training image itself is the host (``podman run IMAGE train``);
- ``tf-config`` (``tf_config``): a ``tf-mwms`` job's one worker per host with ``TF_CONFIG``; chosen
  for such jobs in place of ``horovodrun``, never named by a user;
- ``torchrun`` (``torchrun``): a ``torchrun`` job's ``torchrun`` once per simulated host (static
  rendezvous on a free localhost port), each rank entering its host through ``rank_entry``.

Which launchers run a distribution, and its default, is its entry's ``local_launchers`` in
``sagemaker_dist.contract.distributions``.

Each launcher implements one protocol, ``base.Launcher`` (``check``, ``interface``, ``group``,
``supervise``): ``entry_ranks`` for horovodrun, mpirun, tf-config and torchrun, ``toolkit_hosts`` for the
toolkit and the container; ``table`` maps each name to its implementation, and ``run_local`` finds the
job's launcher there. Every launcher's ranks run as a ``RankGroup`` (``base``): its own process
group, output relayed with the rank in front, killed as a whole.
"""

from __future__ import annotations

# the names live in the registry of distributions, whose entries name the launchers that run them
from sagemaker_dist.contract.distributions import CONTAINER, HOROVODRUN, MPIRUN, TOOLKIT, TORCHRUN
from sagemaker_dist.contract.distributions import TF_CONFIG_LAUNCHER as TF_CONFIG
from sagemaker_dist.contract.distributions import USER_LAUNCHERS as LAUNCHERS  # what a user may ask for

__all__ = [
    "CONTAINER",
    "HOROVODRUN",
    "LAUNCHERS",
    "MPIRUN",
    "TF_CONFIG",
    "TOOLKIT",
    "TORCHRUN",
]
