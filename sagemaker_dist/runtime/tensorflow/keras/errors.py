"""The error ``setup()`` and its helpers raise, in its own file so every part can raise it without cycles."""

from __future__ import annotations

from sagemaker_dist.errors import ConfigurationError


class TrainingSetupError(ConfigurationError):
    """A Horovod/Keras setting that cannot work (names the setting and what to change)."""
