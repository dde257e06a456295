#!/bin/sh
# The image's entry point (container/Dockerfile): the base image's own start, under
# `python -m sagemaker_dist.host.stop_forwarding` as PID 1.
#
# SageMaker stops a job (a stop, a spot interruption) with SIGTERM to the container's PID 1 and SIGKILL
# about 120 s later. Without this, PID 1 is the DLC's `bash -m start_with_right_hostname.sh` (or, on the
# stand-in, the toolkit's `train`): a PID 1 without a SIGTERM handler never sees the signal (the kernel
# drops it), so the ranks got nothing until the SIGKILL. stop_forwarding handles it: it sends SIGTERM
# to every rank process of the container (not to mpirun or the toolkit, which stay unchanged), the
# ranks agree on a step, checkpoint it and exit 0, and it reaps orphans as PID 1. Exit status: CMD's.
set -e
if [ -f /usr/local/bin/start_with_right_hostname.sh ]; then
  # the TF DLC's entry point: `train` with the host name SageMaker gives the host
  exec python -m sagemaker_dist.host.stop_forwarding bash -m /usr/local/bin/start_with_right_hostname.sh "$@"
fi
exec python -m sagemaker_dist.host.stop_forwarding "$@"
