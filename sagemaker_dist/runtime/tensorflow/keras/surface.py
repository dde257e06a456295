"""What both helpers return has the same surface, so a script switches distribution with one line; and
the session both start the same way (``start_session``)."""

from __future__ import annotations

from contextlib import nullcontext

from sagemaker_dist.runtime.tensorflow.keras.reader_resume import (
    SHUFFLED_AFTER_THE_READER,
    resume_reader,
    shuffled_after_the_reader,
)
from sagemaker_dist.runtime.training_session import TrainingSession


def start_session(args, rank: int, local_rank: int, size: int, position, found, share=None):
    """``(session, reader, (epoch, step))`` for a rank whose checkpoints say ``position`` (``found``: the
    checkpoint, where this rank holds it): the train channel's reader resumed there (its FIFOs shuffled
    as the epochs they carry; a resume inside an epoch replays them; ``share``: ``resume_reader``'s),
    then the rank's ``TrainingSession``: its stop (SIGTERM taken unless ``stop_on_sigterm=False``) and
    step-checkpoint schedule, from ``args`` (``SetupArguments``)."""
    reader, (epoch, step) = resume_reader(args.root, rank, local_rank, size, position, found, share)
    session = TrainingSession.begin(
        rank,
        stop_on_sigterm=args.stop_on_sigterm,
        grace=args.stop_grace,
        every_steps=args.checkpoint_every_steps,
        every_seconds=args.checkpoint_every_seconds,
    )
    return session, reader, (epoch, step)


class FitSurface:
    """``is_chief``, ``verbose``, ``scope()`` and ``fit_kwargs()`` over a ``rank`` and ``callbacks``."""

    rank: int
    callbacks: list
    initial_epoch: int
    _order_checked = False

    def check_order(self, batches) -> None:
        """Say once, on the chief, that a ``.shuffle`` after the reader breaks the exact resume (the
        job would otherwise end 0 having trained part of a stopped epoch twice)."""
        if not self._order_checked:
            self._order_checked = True
            if self.is_chief and shuffled_after_the_reader(batches):
                print(SHUFFLED_AFTER_THE_READER, flush=True)

    @property
    def is_chief(self) -> bool:
        """True on rank (worker) 0, the only one whose checkpoints, logs and model are kept."""
        return self.rank == 0

    @property
    def verbose(self) -> int:
        """Keras ``verbose``: one line per epoch on the chief, silent elsewhere."""
        return 2 if self.is_chief else 0

    def scope(self):
        """Where to build and compile the model: the strategy's scope (none needed for Horovod)."""
        return nullcontext()

    saves_on_every_worker = False  # MultiWorkerMirroredStrategy: every worker must take part in a save

    def save_model(self, model, export_dir) -> str | None:
        """Save ``model`` for TensorFlow Serving (a SavedModel; Keras 3 ``export``) from the chief; the
        path, or None where nothing is kept. Call it on every worker."""
        if not self.is_chief and not self.saves_on_every_worker:
            return None
        import tempfile

        from sagemaker_dist.runtime.tensorflow.keras.patches import keras_major

        with nullcontext(str(export_dir)) if self.is_chief else tempfile.TemporaryDirectory() as where:
            if keras_major() >= 3:  # Keras 3's save() writes .keras files only
                model.export(where, verbose=False)
            else:
                model.save(where, include_optimizer=False)
        return str(export_dir) if self.is_chief else None

    def fit_kwargs(self, **extra) -> dict:
        """Keyword arguments for ``model.fit``: callbacks (plus ``callbacks=`` given here, run after
        ours), initial epoch and verbosity; anything else given is passed through."""
        kwargs = {
            "callbacks": list(self.callbacks),
            "initial_epoch": self.initial_epoch,
            "verbose": self.verbose,
        }
        kwargs["callbacks"].extend(extra.pop("callbacks", None) or [])
        kwargs.update(extra)
        return kwargs
