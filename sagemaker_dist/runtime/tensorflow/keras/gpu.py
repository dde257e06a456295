"""One GPU per local rank: each process sees only its own GPU, so ranks never share one by accident."""

from __future__ import annotations

from sagemaker_dist.runtime.tensorflow.keras.errors import TrainingSetupError


def pin_gpu(local_rank: int, local_size: int) -> str | None:
    """Make only GPU ``local_rank`` visible to this process, with memory growth; None on CPU hosts."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    if local_size > len(gpus):
        raise TrainingSetupError(
            f"{local_size} processes run on this host but it has {len(gpus)} GPU(s); set "
            f"sagemaker_mpi_num_of_processes_per_host (processes_per_host) to at most {len(gpus)}"
        )
    try:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
    except RuntimeError as exc:
        raise TrainingSetupError(
            "TensorFlow had already initialised its GPUs, so one GPU per rank cannot be pinned; call "
            "horovod_keras.setup() before building the model, the optimizer or any tensor"
        ) from exc
    return gpus[local_rank].name
