"""Every error sagemaker-dist raises, in four families a caller can catch by what went wrong.

- ``ConfigurationError``: the input cannot work (a job, a layout, a request, an argument); fix it and
  run again. Also a ``ValueError``, as bad arguments are in Python.
- ``DataError``: the data cannot be read as promised (framing, CRCs, a missing FIFO or file).
  Also a ``ValueError``.
- ``AwsError``: a call to AWS (or the S3 endpoint in use) failed; the message names the call, the
  error code and what to check.
- ``JobFailedError``: a training job ran and failed (a rank died, the job ended Failed or Stopped).

The CLI prints any ``SageMakerDistError`` as ``error: ...`` and exits 2; anything else is our bug
and keeps its traceback. Stdlib only: the container runtime imports it too.
"""

from __future__ import annotations


class SageMakerDistError(Exception):
    """Base of every error this package raises on purpose; its message says what to do."""


class ConfigurationError(SageMakerDistError, ValueError):
    """A job description, argument or request that cannot work as given."""


class DataError(SageMakerDistError, ValueError):
    """Input data that cannot be read as the job says it is (format, framing, missing stream)."""


class AwsError(SageMakerDistError):
    """An AWS (or S3 endpoint) call failed; the message names the call and the error code."""


class JobFailedError(SageMakerDistError, RuntimeError):
    """A training job ran and failed; the message names the rank or host and the reason."""
