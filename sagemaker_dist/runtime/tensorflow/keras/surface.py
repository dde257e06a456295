"""What both helpers return has the same surface, so a script switches distribution with one line."""

from __future__ import annotations

from contextlib import nullcontext


class FitSurface:
    """``is_chief``, ``verbose``, ``scope()`` and ``fit_kwargs()`` over a ``rank`` and ``callbacks``."""

    rank: int
    callbacks: list
    initial_epoch: int

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
