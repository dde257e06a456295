"""How local mode starts a job's ranks: one vocabulary, one module per launcher.

- ``horovodrun`` and ``mpirun`` (``mpi``): every rank on this machine, started by Horovod's or Open
  MPI's launcher, each entering its simulated host through ``sagemaker_dist.local.rank_entry``;
- ``toolkit`` (``toolkit``, with ``toolkit_host``): AWS's sagemaker-training entry point runs each
  simulated host in a namespace of its own and starts the ranks itself, as in the DLC;
- ``container`` (``container``): the training image itself is the host (``podman run IMAGE train``);
- ``tf-config`` (``tf_config``): a ``tf-mwms`` job's one worker per host with ``TF_CONFIG``; chosen
  for such jobs in place of ``horovodrun``, never named by a user.

Every launcher runs as a ``RankGroup`` (``mpi``): its own process group, output relayed with the
rank in front, killed as a whole.
"""

from __future__ import annotations

HOROVODRUN = "horovodrun"
MPIRUN = "mpirun"
TOOLKIT = "toolkit"
CONTAINER = "container"
TF_CONFIG = "tf-config"

LAUNCHERS = (HOROVODRUN, MPIRUN, TOOLKIT, CONTAINER)  # what a user may ask for
TOOLKIT_HOST_LAUNCHERS = (TOOLKIT, CONTAINER)  # the image's toolkit entry point starts the ranks
