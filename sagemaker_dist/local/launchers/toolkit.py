"""``launcher="toolkit"``: each simulated host runs AWS's sagemaker-training entry point itself, in the
container environment (TF, Horovod, mpi4py, the toolkit, no SageMaker SDK), inside a private mount
and PID namespace where its tree is ``/opt/ml``. The toolkit then builds and runs mpirun, and the
entry script sees what it would see in the TF DLC: its arguments, ``SM_*``, ``LD_PRELOAD``.

The host runs in the job's own network namespace (``private_net``; only loopback), so what its
processes open (mpirun's daemons, tf-mwms's gRPC server) is reachable from nowhere else; the S3
endpoint on this machine's loopback is relayed in at the same port: the toolkit downloads the source
package from it and the ranks sync TensorBoard to it, as they reach S3 on SageMaker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.contract.environment import container_python, search_path
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local.launchers import TOOLKIT
from sagemaker_dist.local.launchers.base import RankGroup
from sagemaker_dist.local.launchers.mpi import check_horovod_mpi
from sagemaker_dist.local.launchers.toolkit_preflight import toolkit_host_problem
from sagemaker_dist.local.supervision import TRACEBACK, rank_failure

CONTAINER_PYTHON_ENV = "SAGEMAKER_DIST_CONTAINER_PYTHON"
# the DLC's SAGEMAKER_TRAINING_MODULE where none is named: the default distribution's (its registry entry)
DEFAULT_TRAINING_MODULE = distribution(None).toolkit_training_module


class ToolkitLauncherError(ConfigurationError):
    """The toolkit launcher cannot run on this machine as set up; the message says what to do."""


def default_container_python() -> Path:
    """``$SAGEMAKER_DIST_CONTAINER_PYTHON``, else the ``.venv-toolkit`` that scripts/setup.sh makes
    beside the environment running this."""
    return container_python() or Path(sys.prefix).parent / ".venv-toolkit" / "bin" / "python"


def toolkit_modules(training_module: str, horovod: bool) -> tuple[str, ...]:
    """What the container Python must import to run a toolkit host: AWS's ``train``, the DLC's
    framework toolkit (``SAGEMAKER_TRAINING_MODULE``), mpi4py where the toolkit runs mpirun, our runtime."""
    mpi = ("mpi4py",) if horovod else ()
    return ("sagemaker_training.cli.train", training_module.split(":")[0], *mpi, "sagemaker_dist.runtime")


def check_toolkit_host(
    container_python: Path | None = None,
    *,
    horovod: bool = True,
    work_dir: str | os.PathLike | None = None,
    training_module: str = DEFAULT_TRAINING_MODULE,
) -> Path:
    """Fail early, naming the fix, where a toolkit host cannot start: not root, no ``unshare``, no
    namespaces, no overlays in ``work_dir`` (the pre-flight tries each), or a container Python without
    the toolkit and the DLC's ``training_module``. For a Horovod job (``horovod``; tf-mwms and torchrun
    need no Horovod) the toolkit starts the ranks with mpirun, so also no mpirun, or a container
    Python whose Horovod was built without MPI (each rank would train alone). Returns the container
    Python."""
    python = Path(container_python or default_container_python())
    problem = toolkit_host_problem(work_dir)  # root, unshare, namespaces, overlays: tried, not guessed
    if problem:
        raise ToolkitLauncherError(problem)
    needed = toolkit_modules(training_module, horovod)
    check = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    try:
        found = subprocess.run([str(python), "-c", check, *needed], capture_output=True, text=True)
    except OSError as exc:
        found = subprocess.CompletedProcess([], 1, "", str(exc))
    if found.returncode:
        last = (found.stderr.strip().splitlines() or ["not found"])[-1]
        raise ToolkitLauncherError(
            f"launcher 'toolkit' runs the image's environment, and {python} cannot import "
            f"{', '.join(needed)} ({last}). Run scripts/setup.sh (it makes .venv-toolkit) or set "
            f"${CONTAINER_PYTHON_ENV} to a Python with sagemaker-training 4.8.3, "
            "sagemaker-tensorflow-training 20.5.0 (TensorFlow, Horovod, mpi4py) or "
            "sagemaker-pytorch-training 2.9.0 (PyTorch), and sagemaker-dist[runtime]"
        )
    if horovod:
        if not shutil.which("mpirun", path=_container_path(python, search_path())):
            raise ToolkitLauncherError(
                "launcher 'toolkit' starts a Horovod job's ranks with the toolkit's mpirun, and there is no "
                "mpirun here: install Open MPI with its headers (Debian: apt-get install openmpi-bin "
                "libopenmpi-dev; ./scripts/setup.sh does, and rebuilds Horovod with MPI after)"
            )
        check_horovod_mpi(python, TOOLKIT, error=ToolkitLauncherError)
    return python


def _container_path(python: Path, path: str) -> str:
    """PATH in the container environment: its ``bin`` first (its ``train``, then this machine's mpirun)."""
    return os.pathsep.join([str(python.parent), path])


def toolkit_environment(
    base: dict[str, str],
    python: Path,
    job_variables: Mapping[str, str],
    training_module: str = DEFAULT_TRAINING_MODULE,
) -> dict[str, str]:
    """The container's environment: this machine's (S3 endpoint and credentials included), what the
    platform sets from the request (``job_variables``: ``TrainingRequest.container_variables``) and
    what the DLC (its ``training_module``) sets; no ``SM_*`` (the toolkit makes those), the container
    environment's ``bin`` first on PATH."""
    env = {k: v for k, v in base.items() if not k.startswith("SM_") and k != "PYTHONPATH"}
    env.update(job_variables)
    env["SAGEMAKER_TRAINING_MODULE"] = training_module
    env["PATH"] = _container_path(python, env.get("PATH", os.defpath))
    return env


_HOROVOD_SHUT_DOWN = "Horovod has been shut down"  # a collective failed by another rank's exit


def blame_the_rank_that_raised(failure: str | None, group: RankGroup, trees) -> str | None:
    """Under the toolkit's mpirun, the rank that raised and the ranks its Horovod shutdown failed race
    to exit, and mpirun names whichever exits first. When the rank it names only failed that way,
    blame the rank with a traceback of its own instead."""
    reported = group.failed_rank()
    if failure is None or reported is None:
        return failure
    lines = group.rank_lines
    if not any(_HOROVOD_SHUT_DOWN in line for line in lines.get(reported[0], [])):
        return failure
    raised = [
        rank
        for rank, rank_lines in sorted(lines.items())
        if rank != reported[0]
        and any(line.startswith(TRACEBACK) for line in rank_lines)
        and not any(_HOROVOD_SHUT_DOWN in line for line in rank_lines)
    ]
    if not raised:
        return failure
    what = f"raised an exception (mpirun named rank {reported[0]}, whose collective failed after it)"
    return rank_failure(group, raised[0], what, trees)


def toolkit_outcome(failure: str | None, trees) -> str | None:
    """The toolkit's own verdict on every host: /opt/ml/output/success, or the failure file it wrote
    (the first host's that wrote one)."""
    for tree in trees:
        failure_file = tree.output_dir / "failure"
        if failure_file.is_file():
            text = failure_file.read_text(errors="replace").strip()
            shown = "\n".join(f"  {line}" for line in text.splitlines()[-15:])
            return (
                f"{failure or 'the toolkit reported a failure'}\n{tree.name}'s /opt/ml/output/failure says:\n"
                f"{shown}"
            )
    missing = [tree.name for tree in trees if not (tree.output_dir / "success").is_file()]
    if failure is None and missing:
        return f"the toolkit exited 0 but wrote no /opt/ml/output/success on {', '.join(missing)}"
    return failure
