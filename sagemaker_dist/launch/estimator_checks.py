"""The estimator's argument checks: what ``DistributedEstimator`` checks and normalises at construction
(and the shared-channel check its ``plan`` makes), needing no AWS call; a bad argument raises
EstimatorError (a ValueError)."""

from __future__ import annotations

import warnings
from pathlib import Path

from sagemaker_dist.aws.instances import normalize_instance_type, processes_per_host
from sagemaker_dist.contract.distributions import DistributionError
from sagemaker_dist.contract.distributions import distribution as registered
from sagemaker_dist.contract.layout import (
    INPUT_MODES,
    PER_WORKER,
    SINGLE,
    ChannelLayout,
    check_distribution,
    fifo_would_be_shared,
)
from sagemaker_dist.contract.toolkit import ToolkitArgumentWarning, changed_hyperparameters
from sagemaker_dist.launch.inputs import EstimatorError, check_s3_uri
from sagemaker_dist.launch.request import (
    DEFAULT_MPI_OPTIONS,
    check_distribution_options,
    check_mpi_options,
    tags_list,
    user_hyperparameters,
)


def check_settings(est) -> None:
    """Check a new estimator's settings and normalise them in place (its ``__post_init__``)."""
    est.instance_type = normalize_instance_type(est.instance_type)
    count = est.instance_count
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise EstimatorError(f"instance_count={count!r}; it must be a whole number >= 1")
    seed = est.object_order_seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise EstimatorError(f"object_order_seed={seed!r}; give a whole number >= 0 (None: name order)")
    check_distribution_options(est.distribution, est.mpi_options, est.default_mpi_options)
    if est.processes_per_host is None:  # one per host, or (None) the type's GPUs
        est.processes_per_host = registered(est.distribution).default_processes_per_host()
    setup_py = est.source_dir is not None and Path(est.source_dir, "setup.py").is_file()
    try:
        registered(est.distribution).check_entry_point(est.entry_point, setup_py)
    except DistributionError as exc:
        raise EstimatorError(str(exc)) from None
    if est.processes_per_host is not None:
        check_distribution(est.distribution, est.processes_per_host)
    est.processes_per_host = processes_per_host(est.instance_type, est.processes_per_host)
    if est.input_mode not in INPUT_MODES:
        raise EstimatorError(f"input_mode={est.input_mode!r}; use one of {', '.join(INPUT_MODES)}")
    if est.shared_channel_input_mode not in (None, *INPUT_MODES):
        raise EstimatorError(
            f"shared_channel_input_mode={est.shared_channel_input_mode!r}; use None or "
            f"one of {', '.join(INPUT_MODES)}"
        )
    est.shared_channel_input_mode = est.shared_channel_input_mode or est.input_mode
    if est.validation not in (SINGLE, PER_WORKER):
        raise EstimatorError(f"validation={est.validation!r}; use 'single' or 'per-worker'")
    est.hyperparameters = user_hyperparameters(est.hyperparameters)
    for problem in changed_hyperparameters(est.hyperparameters, est.toolkit_version):
        warnings.warn(problem, ToolkitArgumentWarning, stacklevel=4)  # before any AWS call
    for what in ("output_path", "code_location", "checkpoint_s3_uri", "tensorboard_s3_uri"):
        if getattr(est, what) is not None:
            check_s3_uri(getattr(est, what), what)
    if bool(est.subnets) != bool(est.security_group_ids):
        raise EstimatorError("VPC config needs both subnets= and security_group_ids= (or neither)")
    est.subnets = list(est.subnets or [])
    est.security_group_ids = list(est.security_group_ids or [])
    est.tags = tags_list(est.tags)
    est.environment = {str(k): str(v) for k, v in (est.environment or {}).items()}
    extra = [est.mpi_options] if isinstance(est.mpi_options, str) else list(est.mpi_options)
    check_mpi_options(extra)
    defaults = DEFAULT_MPI_OPTIONS if est.default_mpi_options else ()
    est.mpi_options = " ".join([*defaults, *extra]).strip()


def check_shared_channels(shared_channel_input_mode: str, layout: ChannelLayout) -> None:
    """Refuse a layout whose shared channels would be Pipe FIFOs read by several processes."""
    shared = layout.shared_channels
    if shared and fifo_would_be_shared(shared_channel_input_mode, layout.processes_per_host):
        raise EstimatorError(
            f"channel(s) {', '.join(shared)} are shared by all {layout.processes_per_host} processes "
            "on each host, but a Pipe-mode FIFO has one reader (several readers split its bytes "
            "and stall the job); use shared_channel_input_mode='File' or 'FastFile', or "
            "validation='per-worker' for the validation data"
        )
