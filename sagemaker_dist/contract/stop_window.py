"""How long a stopped job has to end, as SageMaker gives it: SIGTERM to every process of the training
container (a StopTrainingJob, a spot interruption, the time limit), then SIGKILL about 120 s later.
Local mode, the Slurm script and the Kubernetes pods give the same window, and the pipe agent drains
within it so that the ranks' stop checkpoint reaches S3 before the end. Stdlib only."""

from __future__ import annotations

STOP_WINDOW_S = 120  # SIGTERM to SIGKILL
AGENT_DRAIN_S = 110  # a pipe agent's life after its SIGTERM, at most: inside the window, after the ranks'
