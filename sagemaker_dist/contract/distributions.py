"""The registry of distributions: how the workers of a job train together, one entry each.

Every rule that depends on the distribution lives in its ``Distribution`` entry: its framework, how
many processes a host runs, the hyperparameters the SageMaker toolkit reads to start it, the rank
variables its processes get, the image it runs in, the local launchers that run it, and whether the
MPI platforms (Slurm, Kubernetes' MPIJob) can start it. The rest of the package asks the registry
(``distribution(name)``) and never compares a distribution's name; ``tests/test_architecture.py``
checks that. A new distribution is one entry in ``REGISTRY`` plus its local launcher.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.rank_slots import RANK_VARIABLES, TF_CONFIG, TORCHRUN_VARIABLES
from sagemaker_dist.errors import ConfigurationError

# processes per host
PER_GPU = "per-gpu"  # one process per GPU of the host (or as many as asked, up to the GPUs)
ONE_PER_HOST = "one-per-host"  # one worker per host, driving every GPU of it

# local launchers (sagemaker_dist.local.launchers holds their code): the names a job can run under
HOROVODRUN = "horovodrun"
MPIRUN = "mpirun"
TOOLKIT = "toolkit"
CONTAINER = "container"
TF_CONFIG_LAUNCHER = "tf-config"  # one worker per host with TF_CONFIG; never named by a user
TORCHRUN = "torchrun"  # torchrun once per simulated host (local/launchers/torchrun.py)
USER_LAUNCHERS = (HOROVODRUN, MPIRUN, TOOLKIT, CONTAINER, TORCHRUN)  # what a user may ask for
# the launcher a local job gets when none is named (the CLI's and LocalBackend's default); a
# distribution that does not run under it runs under its own default launcher instead
UNNAMED_LAUNCHER = HOROVODRUN


class DistributionError(ConfigurationError):
    """A distribution that is not registered, or a setting it cannot run with."""


MPIJOB = "MPIJob"  # kubeflow.org/v2beta1, mpi-operator (platforms/k8s_mpijob.py)
TRAINJOB = "TrainJob"  # trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2 (platforms/k8s_trainjob.py)
# what each Kubernetes object a distribution names does, for a message about a job it cannot run
KUBERNETES_KINDS = {MPIJOB: "starts Horovod ranks with mpirun", TRAINJOB: "starts torchrun on each node"}


@dataclass(frozen=True)
class DlcImage:
    """An AWS Deep Learning Container training image, as ``sagemaker.core.image_uris`` names it."""

    framework: str  # "tensorflow", "pytorch"
    version: str
    py_version: str


# Slurm's view of a rank, in the order of a rank-variable family (rank, local rank, size, local size);
# ``{tasks}`` is the tasks per node
SLURM_RANK_VALUES = ("$SLURM_PROCID", "$SLURM_LOCALID", "$SLURM_NTASKS", "{tasks}")

# Open MPI's ranks wait for each other in a busy loop unless they know that their machine is
# oversubscribed, which a host's slots hide. Local mode runs every host's ranks on one machine, where
# the ranks that wait (Horovod's background thread, from hvd.init on) starve those still starting: its
# MPI ranks yield the core when idle (the demo's 2 x 2 ranks on 2 cores under mpirun: 32 s, not 47 s)
LOCAL_MPI_ENV = (("OMPI_MCA_mpi_yield_when_idle", "1"),)


@dataclass(frozen=True)
class SlurmStart:
    """How an sbatch script's ``srun`` starts one task per rank: the MPI plugin it uses (``pmix`` for an
    MPI-built Horovod, None for none); each rank gets its distribution's first family of rank variables
    from Slurm's (``SLURM_RANK_VALUES``), plus ``extra`` (shell words; ``$SD_MASTER_ADDR`` and
    ``$SD_MASTER_PORT`` are the first node's address and a port of the job's own, where ``rendezvous``)."""

    mpi: str | None
    extra: tuple[tuple[str, str], ...] = ()
    rendezvous: bool = False  # the ranks meet at the first node (torch.distributed's env:// store)


@dataclass(frozen=True)
class Distribution:
    """One way to train data-parallel: everything the SDK side, local mode and the platforms need to
    know about it."""

    name: str
    framework: str  # the framework the script trains with ("tensorflow")
    title: str  # what trains, in messages ("Horovod")
    help: str  # the --distribution help: what runs, per host, with what
    runs: str  # how its processes start, in messages ("one worker per host with TF_CONFIG, no MPI")
    workers: str  # what the layout calls its processes ("Horovod rank(s)")
    processes_per_host: str  # PER_GPU or ONE_PER_HOST
    enabled_hyperparameter: str  # the toolkit's switch for it (set to "true")
    mpi: bool  # the toolkit starts its processes with mpirun (and reads the MPI hyperparameters)
    # the environment its processes learn their rank from: families of (rank, local rank, size, local
    # size) in order of preference (one name alone where one variable holds them all: TF_CONFIG)
    rank_variables: tuple[tuple[str, ...], ...]
    # with no image_uri: AWS's DLC as is (the sagemaker_dist package then travels in the source tarball),
    # or (None) our container in the caller's ECR, in ``repository`` (container/build_and_push.sh)
    image: DlcImage | None
    local_launchers: tuple[str, ...]  # the local launchers that run it, its default first
    slurm: SlurmStart | None  # how an sbatch script starts its ranks (None: it cannot)
    # the Kubernetes object that runs it (None: none): mpi-operator's MPIJob (mpirun from a launcher
    # pod) or Kubeflow Trainer's TrainJob (torchrun on each node pod)
    kubernetes: str | None
    keras_helper: str | None  # the runtime module a Keras script sets up with (sagemaker_dist.runtime.*)
    # the toolkit takes the processes per host from MPI_PROCESSES_PER_HOST without running mpirun
    # (torch_distributed: torchrun --nproc_per_node; its default is the host's GPUs)
    toolkit_processes_per_host: bool = False
    # the SageMaker instance types it runs on, by prefix (empty: any); SDK v2's rule for torch_distributed
    sagemaker_instance_prefixes: tuple[str, ...] = ()
    demo_script: str = "train_cifar10.py"  # local mode's demo training script (local/demo_job/)
    sharded_demo: bool = False  # it runs local mode's sharded-model demo (--model gpt: PyTorch FSDP2)
    # the toolkit runs only a Python script of a source dir without setup.py (torch_distributed refuses
    # a package: "Python packages are not supported", and any other entry point)
    scripts_only: bool = False
    # the DLC's SAGEMAKER_TRAINING_MODULE: the framework toolkit that AWS's `train` hands the job to
    toolkit_training_module: str = "sagemaker_tensorflow_container.training:main"
    # the toolkit starts its processes on each host by itself (torchrun --node_rank R against algo-1:7777),
    # with no SSH from a master and no fixed port but the master's: local mode then runs one toolkit host
    # per simulated host, side by side on the job's loopback
    toolkit_starts_each_host: bool = False
    # what local mode sets in a toolkit host's environment, whatever the shell's holds: for torchrun, that
    # each rank's lines name the rank, which local mode's line tagging needs (torchrun reads its options
    # from PET_* variables: PET_TEE=3 is --tee 3, "[default0]:line")
    local_toolkit_env: tuple[tuple[str, str], ...] = ()
    # what it sets there where the shell does not: tuning for ranks that share one machine (LOCAL_MPI_ENV
    # for mpirun), which a user may set otherwise
    local_toolkit_defaults: tuple[tuple[str, str], ...] = ()
    # the TF toolkit rewrites a tuning trial's model_dir to "<model_dir>/<job>/model"
    # (sagemaker_tensorflow_container.training); without one that is "None/<job>/model", a relative
    # directory the script saves into and the model never leaves. A tuning job then gets the training
    # request's S3 output path as its model_dir, as the SageMaker SDK's TensorFlow estimator sets one
    tuning_sets_model_dir: bool = False
    repository: str = "sagemaker-dist"  # our image's ECR repository (build_and_push.sh), where image is None

    @property
    def default_launcher(self) -> str:
        return self.local_launchers[0]

    def slurm_rank_variables(self, tasks_per_node: int) -> tuple[tuple[str, str], ...]:
        """Each srun task's rank variables (name, shell word), from Slurm's: its first family's, then
        the entry's extras."""
        if self.slurm is None:
            return ()
        values = (v.format(tasks=tasks_per_node) for v in SLURM_RANK_VALUES)
        return (*zip(self.rank_variables[0], values), *self.slurm.extra)

    @property
    def rank_markers(self) -> tuple[str, ...]:
        """The variables whose presence makes a process one of its ranks (each family's first)."""
        return tuple(family[0] for family in self.rank_variables)

    @property
    def one_per_host(self) -> bool:
        return self.processes_per_host == ONE_PER_HOST

    def default_processes_per_host(self) -> int | None:
        """Processes per host when none is asked for: 1, or None (the host's GPUs)."""
        return 1 if self.one_per_host else None

    def check_processes_per_host(self, processes_per_host: int) -> None:
        if self.one_per_host and processes_per_host != 1:
            raise DistributionError(
                f"distribution {self.name!r} runs one worker per host ({self.title} drives every GPU of its "
                f"host), so processes per "
                f"host must be 1, not {processes_per_host!r}; leave processes_per_host unset, or use "
                f"{_per_gpu_hint()}"
            )

    def toolkit_hyperparameters(self, processes_per_host: int, mpi_options: str) -> dict[str, str]:
        """The hyperparameters the sagemaker-training toolkit reads to start the job's processes."""
        out = {self.enabled_hyperparameter: "true"}
        if self.mpi or self.toolkit_processes_per_host:
            out[hp.MPI_PROCESSES_PER_HOST] = str(processes_per_host)
        if self.mpi:
            out[hp.MPI_CUSTOM_OPTIONS] = mpi_options
        return out

    def check_sagemaker_instance_type(self, instance_type: str) -> None:
        """Refuse an instance type SageMaker's toolkit cannot run it on (SDK v2's rule: torch_distributed
        on GPU ``ml.p*``/``ml.g*`` and Trainium ``ml.trn*`` only); local mode runs on any."""
        prefixes = self.sagemaker_instance_prefixes
        name = str(instance_type).strip().lower()
        if prefixes and not (name if name.startswith("ml.") else f"ml.{name}").startswith(prefixes):
            kinds = ", ".join(f"{p}*" for p in prefixes)
            raise DistributionError(
                f"distribution {self.name!r} runs on SageMaker on GPU or Trainium instance types ({kinds}), "
                f"not {instance_type!r} (a CPU type: the PyTorch toolkit's torch_distributed refuses it); "
                "pick one such as ml.g5.12xlarge or ml.p4d.24xlarge, or run it here with sagemaker-dist local"
            )

    def check_entry_point(self, entry_point: str, source_has_setup_py: bool) -> None:
        """Refuse an entry point the toolkit would not start for it (``scripts_only``)."""
        if not self.scripts_only:
            return
        if not str(entry_point).endswith(".py"):
            raise DistributionError(
                f"distribution {self.name!r} runs a Python script under torchrun (sagemaker-training's "
                f"torch_distributed); entry point {str(entry_point)!r} is not a .py file"
            )
        if source_has_setup_py:
            raise DistributionError(
                f"distribution {self.name!r}: the source dir holds a setup.py, which makes "
                "sagemaker-training treat it as a package, and torch_distributed refuses packages ('Python "
                "packages are not supported'); move setup.py out of the source dir (dependencies go in "
                "requirements.txt)"
            )

    def local_launcher(self, asked: str) -> str:
        """The launcher that runs a local job of this distribution when ``asked`` is asked for."""
        if asked in self.local_launchers:
            return asked
        if asked == UNNAMED_LAUNCHER:
            return self.default_launcher
        named = [n for n in self.local_launchers[1:] if n in USER_LAUNCHERS]
        raise DistributionError(
            f"this is a {self.name!r} job ({self.runs}); launcher {asked!r} is for "
            f"{_runners_of(asked)} jobs. Leave the launcher unset"
            + (f", or use {' or '.join(repr(n) for n in named)}" if named else "")
        )


HOROVOD_ENTRY = Distribution(
    name="horovod",
    framework="tensorflow",
    title="Horovod",
    help="one process per GPU under mpirun (Horovod 0.28.1, TF <= 2.15)",
    runs="one process per GPU under mpirun",
    workers="Horovod rank(s)",
    processes_per_host=PER_GPU,
    enabled_hyperparameter=hp.MPI_ENABLED,
    mpi=True,
    rank_variables=RANK_VARIABLES,  # Open MPI's (the toolkit's mpirun), then Horovod's (horovodrun)
    image=None,  # container/Dockerfile: the newest TF DLC with TF <= 2.15, plus Horovod
    local_launchers=(HOROVODRUN, MPIRUN, TOOLKIT, CONTAINER),
    slurm=SlurmStart("pmix"),  # the runtime reads mpirun's rank variables; under srun, Slurm's say the same
    kubernetes=MPIJOB,
    keras_helper="sagemaker_dist.runtime.tensorflow.horovod_keras",
    tuning_sets_model_dir=True,
    local_toolkit_defaults=LOCAL_MPI_ENV,  # the toolkit's mpirun passes OMPI_MCA_* on to every rank
)
TF_MWMS_ENTRY = Distribution(
    name="tf-mwms",
    framework="tensorflow",
    title="MultiWorkerMirroredStrategy",
    help="TensorFlow's MultiWorkerMirroredStrategy, one worker per host (any TF, Keras 3, the current DLC)",
    runs="one worker per host with TF_CONFIG, no MPI",
    workers="MultiWorkerMirroredStrategy worker(s)",
    processes_per_host=ONE_PER_HOST,
    enabled_hyperparameter=hp.MWMS_ENABLED,
    mpi=False,
    rank_variables=((TF_CONFIG,),),
    image=DlcImage("tensorflow", "2.21", "py312"),  # the current TF training DLC (Keras 3, no Horovod)
    local_launchers=(TF_CONFIG_LAUNCHER, TOOLKIT, CONTAINER),
    slurm=None,  # one worker per host with TF_CONFIG: not written for Slurm
    kubernetes=None,  # one worker per host with TF_CONFIG: not written for Kubernetes
    keras_helper="sagemaker_dist.runtime.tensorflow.mwms_keras",
    tuning_sets_model_dir=True,
)
TORCHRUN_ENTRY = Distribution(
    name="torchrun",
    framework="pytorch",
    title="PyTorch DDP",
    help="PyTorch DDP under torchrun, one process per GPU (the PyTorch DLC; sagemaker_dist.runtime's "
    "setup_ddp, PipeBatches, PipeTraining)",
    runs="one process per GPU under torchrun",
    workers="torchrun rank(s)",
    processes_per_host=PER_GPU,
    enabled_hyperparameter=hp.TORCH_DISTRIBUTED_ENABLED,
    mpi=False,
    rank_variables=(TORCHRUN_VARIABLES,),
    # container/Dockerfile FROM the PyTorch 2.8 training DLC (build_and_push.sh --pytorch): the package,
    # its compiled readers, and an entry point that forwards SIGTERM to the ranks
    image=None,
    repository="sagemaker-dist-pytorch",
    local_launchers=(TORCHRUN, TOOLKIT, CONTAINER),
    slurm=SlurmStart(  # one task per rank with torchrun's variables, as torchrun would set them
        None,
        (
            ("GROUP_RANK", "$SLURM_NODEID"),
            ("MASTER_ADDR", "$SD_MASTER_ADDR"),
            ("MASTER_PORT", "$SD_MASTER_PORT"),
        ),
        rendezvous=True,
    ),
    kubernetes=TRAINJOB,  # the Trainer's Torch plugin gives torchrun its PET_* options
    keras_helper=None,
    toolkit_processes_per_host=True,
    sagemaker_instance_prefixes=("ml.p", "ml.g", "ml.trn"),
    demo_script="train_torch.py",
    sharded_demo=True,
    scripts_only=True,
    toolkit_training_module="sagemaker_pytorch_container.training:main",  # the PyTorch DLCs' ENV
    toolkit_starts_each_host=True,
    local_toolkit_env=(("PET_TEE", "3"),),
)

HOROVOD = HOROVOD_ENTRY.name
TF_MWMS = TF_MWMS_ENTRY.name
REGISTRY: Mapping[str, Distribution] = {d.name: d for d in (HOROVOD_ENTRY, TF_MWMS_ENTRY, TORCHRUN_ENTRY)}
NAMES = tuple(REGISTRY)  # in order; the first is the default
DEFAULT = NAMES[0]
# a request without our layout is run as the toolkit runs an MPI job: as the default (Horovod)
HELP = "; ".join(f"{d.name}: {d.help}" for d in REGISTRY.values()) + f". Default {DEFAULT}"


def rank_markers() -> tuple[str, ...]:
    """Every registered distribution's rank markers: a process with one of them set is a rank."""
    return tuple(marker for d in REGISTRY.values() for marker in d.rank_markers)


def is_registered(name: object) -> bool:
    return isinstance(name, str) and name in REGISTRY


def is_default(name: str) -> bool:
    """A layout leaves the default out of its JSON, so layouts written before the field stay readable."""
    return name == DEFAULT


def distribution(name: str | None) -> Distribution:
    """The entry of ``name`` (None: the default), or DistributionError naming the registered ones."""
    if name is None:
        return REGISTRY[DEFAULT]
    if not is_registered(name):
        raise DistributionError(f"distribution={name!r}; use one of {', '.join(NAMES)}")
    return REGISTRY[name]


def names_where(predicate: Callable[[Distribution], bool]) -> str:
    """The distributions for which ``predicate`` holds, for a message: "distribution 'a' or 'b'"."""
    names = [repr(d.name) for d in REGISTRY.values() if predicate(d)]
    return f"distribution {' or '.join(names)}" if names else "no registered distribution"


def _per_gpu_hint() -> str:
    return names_where(lambda d: not d.one_per_host) + " for one process per GPU"


def _runners_of(launcher: str) -> str:
    runs = [d.title for d in REGISTRY.values() if launcher in d.local_launchers]
    return " or ".join(runs) or "no registered"
