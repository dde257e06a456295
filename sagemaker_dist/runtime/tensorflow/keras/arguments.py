"""Every argument of ``setup()``, checked before Horovod starts.

A bad argument found after ``hvd.init()`` fails on some ranks while the others wait in a collective
("Stalled ranks" for hours); found here, it fails every rank at once with the same message, naming the
argument and what to give instead. ``check_arguments`` needs neither TensorFlow nor Horovod;
``check_world`` adds what depends on the number of ranks and runs both before and after ``hvd.init()``.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime.tensorboard_sync import split_s3_uri
from sagemaker_dist.runtime.tensorflow.keras.errors import TrainingSetupError
from sagemaker_dist.runtime.tensorflow.keras.optimizer import base_learning_rate

_RECORD_ARGUMENTS = ("train_records", "total_train_records", "validation_records", "total_validation_records")


@dataclass(frozen=True)
class SetupArguments:
    """``setup()``'s arguments, by the same names, so the checks and the start-up code share one value."""

    optimizer: Any
    learning_rate: float | None = None
    batch_size: int | None = None
    train_records: int | None = None
    total_train_records: int | None = None
    validation_records: int | None = None
    total_validation_records: int | None = None
    warmup_epochs: float = 0
    checkpoints: bool = True
    keep_checkpoints: int | None = 3
    checkpoint_every: int = 1
    tensorboard_dir: str | os.PathLike | None = None
    tensorboard_s3_uri: str | None = None
    tensorboard_interval: float = 30.0
    root: str | os.PathLike | None = None
    pin_gpus: bool = True
    check_channels: bool = True
    stop_on_sigterm: bool = True
    checkpoint_every_steps: int | None = None
    checkpoint_every_seconds: float | None = None
    stop_grace: float = 100.0

    @property
    def validates(self) -> bool:
        """True when a validation record count was given: every rank then validates its own shard."""
        return self.validation_records is not None or self.total_validation_records is not None


def _is_whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _whole(name: str, value, minimum: int, meaning: str) -> None:
    """``value`` is None or a whole number >= ``minimum``; else an error naming ``name``."""
    if value is not None and not (_is_whole(value) and value >= minimum):
        raise TrainingSetupError(f"{name}={value!r}: give {meaning} (a whole number >= {minimum}) or None")


def _number(name: str, value, *, above: float, meaning: str, inclusive: bool = False) -> None:
    """``value`` is a finite number > ``above`` (>= with ``inclusive``); else an error naming ``name``."""
    if not (_is_number(value) and (value >= above if inclusive else value > above)):
        bound = f"{'>=' if inclusive else '>'} {above:g}"
        raise TrainingSetupError(f"{name}={value!r}: give {meaning} (a finite number {bound})")


def _flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TrainingSetupError(f"{name}={value!r}: give True or False")


def _path(name: str, value) -> None:
    if value is not None and (not isinstance(value, str | os.PathLike) or not os.fspath(value)):
        raise TrainingSetupError(f"{name}={value!r}: give a directory path (str or pathlib.Path) or None")


def check_arguments(args: SetupArguments) -> None:
    """Raise ``TrainingSetupError`` for the first argument that cannot work; loads no TF or Horovod."""
    if args.learning_rate is not None:
        _number("learning_rate", args.learning_rate, above=0, meaning="the single-worker learning rate")
    base_learning_rate(args.optimizer, args.learning_rate)
    _whole("batch_size", args.batch_size, 1, "the per-rank batch size")
    _check_records(args)
    _number(
        "warmup_epochs", args.warmup_epochs, above=0, inclusive=True, meaning="the epochs to warm up over"
    )
    if args.warmup_epochs > 0 and args.train_records is None and args.total_train_records is None:
        raise TrainingSetupError("warmup_epochs needs the steps per epoch: pass batch_size and train_records")
    _check_checkpoints(args)
    _check_tensorboard(args)
    _path("root", args.root)
    _flag("pin_gpus", args.pin_gpus)
    _flag("check_channels", args.check_channels)


def _check_records(args: SetupArguments) -> None:
    for what in ("train", "validation"):
        per_rank, total = getattr(args, f"{what}_records"), getattr(args, f"total_{what}_records")
        _whole(f"{what}_records", per_rank, 0, f"the {what} records in this rank's own shard")
        _whole(f"total_{what}_records", total, 0, f"the {what} records of the whole job (one rank only)")
        if per_rank is not None and total is not None:
            raise TrainingSetupError(f"give either {what}_records or total_{what}_records, not both")
    given = [name for name in _RECORD_ARGUMENTS if getattr(args, name) is not None]
    if given and args.batch_size is None:
        raise TrainingSetupError(
            f"{given[0]}= needs batch_size= (the per-rank batch size, >= 1) to give the steps per epoch"
        )


def _check_checkpoints(args: SetupArguments) -> None:
    _flag("checkpoints", args.checkpoints)
    _whole("keep_checkpoints", args.keep_checkpoints, 0, "how many checkpoints to keep (0 or None: all)")
    if not (_is_whole(args.checkpoint_every) and args.checkpoint_every >= 1):
        raise TrainingSetupError(
            f"checkpoint_every={args.checkpoint_every!r}: give a whole number of epochs >= 1"
        )
    _flag("stop_on_sigterm", args.stop_on_sigterm)
    _whole("checkpoint_every_steps", args.checkpoint_every_steps, 1, "the steps between step checkpoints")
    if args.checkpoint_every_seconds is not None:
        _number("checkpoint_every_seconds", args.checkpoint_every_seconds, above=0, meaning="seconds")
    _number("stop_grace", args.stop_grace, above=0, meaning="seconds from SIGTERM to a forced exit")


def _check_tensorboard(args: SetupArguments) -> None:
    _path("tensorboard_dir", args.tensorboard_dir)
    uri = args.tensorboard_s3_uri
    if uri is not None and not isinstance(uri, str):
        raise TrainingSetupError(f"tensorboard_s3_uri={uri!r}: give an s3://bucket/prefix string or None")
    if uri:
        if args.tensorboard_dir is None:
            raise TrainingSetupError(
                "tensorboard_s3_uri needs tensorboard_dir (the local log directory to sync)"
            )
        try:
            split_s3_uri(uri)
        except ConfigurationError as exc:
            raise TrainingSetupError(f"tensorboard_s3_uri={uri!r}: {exc}") from None
    _number("tensorboard_interval", args.tensorboard_interval, above=0, meaning="seconds between uploads")
    if args.tensorboard_dir is not None and importlib.util.find_spec("tensorboard") is None:
        # TensorFlow writes summaries through the tensorboard package; without it Keras's TensorBoard
        # callback fails at the end of the first epoch, after a whole epoch's work, on the chief only
        raise TrainingSetupError(
            f"tensorboard_dir={str(args.tensorboard_dir)!r} needs the tensorboard package, which is not "
            "installed (TensorFlow writes its summaries through it; the tensorflow-cpu 2.21 wheel does "
            f"not bring it): pip install {_tensorboard_requirement()}, or drop tensorboard_dir (and "
            "tensorboard_s3_uri)"
        )


def _tensorboard_requirement() -> str:
    """The TensorBoard that matches the installed TensorFlow (the same minor version), for pip."""
    from importlib import metadata

    for dist in metadata.packages_distributions().get("tensorflow", []):
        try:
            major, minor = metadata.version(dist).split(".")[:2]
        except (metadata.PackageNotFoundError, ValueError):
            continue
        return f"'tensorboard=={major}.{minor}.*'"
    return "tensorboard (the same minor version as TensorFlow)"


def _per_rank(records: int | None, total: int | None, size: int, what: str) -> int | None:
    """This rank's record count. A total only works on one rank: shards are balanced by bytes, not
    records (8 equal files over 3 ranks are 3, 3 and 2 files), so total // size is not any rank's shard."""
    if records is not None and total is not None:
        raise TrainingSetupError(f"give either {what}_records or total_{what}_records, not both")
    if total is not None:
        if size > 1:
            raise TrainingSetupError(
                f"total_{what}_records={total} cannot give this rank's steps on {size} ranks: shards are "
                f"balanced by bytes, so their record counts differ (e.g. 8 equal files over 3 ranks are "
                f"3, 3 and 2 files). Pass {what}_records= the records in this rank's own shard"
            )
        return int(total)
    return records


def check_world(args: SetupArguments, rank: int, size: int) -> tuple[int | None, int | None]:
    """This rank's ``(train, validation)`` record counts on ``size`` ranks; raises, naming the argument,
    what cannot work on that many ranks (no collective: every rank fails the same way)."""
    records = _per_rank(args.train_records, args.total_train_records, size, "train")
    val_records = _per_rank(args.validation_records, args.total_validation_records, size, "validation")
    return records, val_records  # None: the ranks agree on each epoch's end at run time
