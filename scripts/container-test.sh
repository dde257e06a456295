#!/usr/bin/env bash
# Build the training image (container/Dockerfile, unchanged but for build args) on a stand-in for the
# AWS TensorFlow DLC, and its PyTorch form on a stand-in for the PyTorch DLC, then run jobs in them the
# way SageMaker does: `podman run <image> train` with the host's /opt/ml tree bind-mounted, Pipe FIFOs
# fed from S3 by local mode, 2 MPI ranks started by the image's own toolkit
# (tests/container/test_container_image.py); and on 2 hosts, one container each on a private network,
# mpirun over SSH between them, or torchrun on each host (test_cluster_image.py). Idempotent; prints
# each step's time.
#
# Usage: scripts/container-test.sh [--base IMAGE] [--build-only] [-- pytest args]
#        eval "$(scripts/container-test.sh --env)"
#   --base IMAGE  build FROM this image (already in the podman storage below, e.g. a DLC you pulled)
#                 instead of the stand-in: debootstrap's bookworm minbase + container/standin-base
#   --build-only  build the image, run no job
#   --env         print the export lines (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, TMPDIR) that let a
#                 shell run `sagemaker-dist local --launcher container --image IMAGE` on the images this
#                 script built; builds and runs nothing. A run of this script removes every container
#                 of that storage when it ends, so do not run both at once.
# Needs root. Installs Debian's podman, buildah, runc and debootstrap with apt-get when missing; podman's
# settings are scripts/lib/podman-env.sh's (shared with scripts/fresh-machine-check.sh).
# Cached outside the repository, in ${SAGEMAKER_DIST_CACHE:-~/.cache/sagemaker-dist}/podman: the
# debootstrap tarball and podman's image storage (the stand-in keyed by a hash of its Dockerfile,
# build layers). The Horovod wheel scripts/setup.sh built for the same TF, Python and Open MPI is
# installed instead of compiling Horovod in the image, when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/podman-env.sh
IMAGE=${SAGEMAKER_DIST_TEST_IMAGE:-localhost/sagemaker-dist:test}
MWMS_IMAGE=${IMAGE}-mwms  # the same Dockerfile with WITH_HOROVOD=0
TORCH_IMAGE=${IMAGE}-pytorch  # the same Dockerfile with FRAMEWORK=torch, FROM the PyTorch stand-in
STANDIN_REPO=localhost/sagemaker-dist-standin
CACHE_ROOT=$SAGEMAKER_DIST_CACHE_ROOT

die() {
  podman_die "$@"
}

usage() {
  sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
}

base=""
build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="${2:?--base needs an image name}"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --env)
      podman_env_lines "$CACHE_ROOT/podman"
      echo "# images: $IMAGE (Horovod), $MWMS_IMAGE (tf-mwms), $TORCH_IMAGE (torchrun)"
      exit 0 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

podman_tools
[ -x .venv/bin/python ] || bash scripts/setup.sh
podman_env "$CACHE_ROOT/podman"
if [ -n "$base" ] && ! podman image exists "$base"; then
  die "base image $base is not in podman's storage ($PODMAN_HOME/storage). Run without --base to build \
the stand-in for the TensorFlow DLC, or put $base there first (podman pull / podman load, with \
CONTAINERS_STORAGE_CONF pointing at a storage.conf with graphroot = \"$PODMAN_HOME/storage\")"
fi
# 1. The bare Debian base (scripts/lib/podman-env.sh), also when the image is built on another base:
# a test builds from it.
podman_rootfs_image

build() {
  podman build --format docker --layers "$@"
}

# The PyTorch stand-in's build args (container/standin-base/Dockerfile): torch's CPU build, which pip
# finds in PIP_FIND_LINKS on a machine of this kind (mounted read-only at the same path), else on PyPI.
TORCH_STANDIN_ARGS=(--build-arg "FRAMEWORK_PIP=torch==2.13.0 numpy==1.26.4"
  --build-arg ENTRY_PIP=sagemaker-pytorch-training==2.9.0
  --build-arg TRAINING_MODULE=sagemaker_pytorch_container.training:main
  --build-arg "CHECK_IMPORTS=sagemaker_pytorch_container.training, torch.distributed.run")
find_links_args=()
for links in ${PIP_FIND_LINKS:-}; do
  [ -d "$links" ] && find_links_args+=(--volume "$links:$links:ro")
done
[ -n "${PIP_FIND_LINKS:-}" ] && find_links_args+=(--build-arg "PIP_FIND_LINKS=$PIP_FIND_LINKS")

# standin NAME ARGS...: the stand-in DLC tagged NAME-<hash of its Dockerfile and ARGS>, built if missing;
# older ones of NAME are removed. Sets $standin.
standin() {
  local name=$1 key log
  shift
  key=$(printf '%s\n' "$(cat container/standin-base/Dockerfile)" "$@" | sha256sum | cut -c1-16)
  standin="$STANDIN_REPO:$name-$key"
  log="$RUN_DIR/standin-$name-build.log"
  if ! podman image exists "$standin"; then
    step "building the stand-in $name DLC $standin (apt, the framework, the toolkit)"
    build --volume "$CA_BUNDLE:$CA_BUNDLE:ro" --build-arg "ROOTFS_IMAGE=$ROOTFS_IMAGE" "$@" -t "$standin" \
      -f container/standin-base/Dockerfile container/standin-base >"$log" \
      || { tail -30 "$log" >&2; die "building the stand-in $name DLC failed"; }
    step_done
  fi
  podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=$STANDIN_REPO" \
    | { grep "^$STANDIN_REPO:$name-" || true; } | { grep -vxF "$standin" || true; } \
    | xargs -r podman rmi >/dev/null 2>&1 || true
}

# 2. The stand-ins for the DLCs (TensorFlow unless --base names one; PyTorch always).
if [ -z "$base" ]; then
  standin tensorflow
  base=$standin
fi
standin pytorch "${TORCH_STANDIN_ARGS[@]}" "${find_links_args[@]}"
torch_base=$standin

# 3. The project image FROM the base. A GPU DLC keeps the defaults (NCCL); a CPU base does not.
wheel_args=()
gpu_args=()
if podman run --rm "$base" sh -c 'command -v nvcc || [ -d /usr/local/cuda ]' >/dev/null 2>&1; then
  echo "   $base has CUDA: Horovod is built with NCCL"
else
  gpu_args=(--build-arg HOROVOD_GPU_OPERATIONS= --build-arg REQUIRE_NCCL=0)
  # the cache key of scripts/setup.sh's Horovod wheel, for the base's Python and Open MPI
  read -r pyver mpi < <(podman run --rm "$base" sh -c \
    'python -c "import sys; print(\"%d.%d\" % sys.version_info[:2])" | tr -d "\n"; echo " mpi-$(mpicc --showme:version 2>/dev/null | head -n1 | tr -cd "[:alnum:].")"')
  key=$(printf '%s|%s|%s|%s|%s' "tensorflow-cpu==2.15.1" "horovod==0.28.1" "$pyver" "$(uname -m)" "$mpi" \
    | sha256sum | cut -c1-16)
  if [ -e "$CACHE_ROOT/horovod-$key" ]; then trusted_cache_dir "$CACHE_ROOT" "$CACHE_ROOT/horovod-$key"; fi
  wheel=$(find "$CACHE_ROOT/horovod-$key" -maxdepth 1 -name 'horovod-*.whl' 2>/dev/null | head -n1)
  if [ -n "$wheel" ]; then
    echo "   installing the Horovod wheel scripts/setup.sh built: $wheel"
    wheel_args=(--volume "$(dirname "$wheel"):/tmp/horovod-wheel:ro"
      --build-arg "HOROVOD_WHEEL=/tmp/horovod-wheel/$(basename "$wheel")")
  else
    echo "   no Horovod wheel for Python $pyver, $mpi in $CACHE_ROOT: compiling it in the image (about 7 min)"
  fi
fi
step "building $IMAGE from container/Dockerfile FROM $base"
build --volume "$CA_BUNDLE:$CA_BUNDLE:ro" --ignorefile container/Dockerfile.dockerignore \
  --build-arg "BASE_IMAGE=$base" "${gpu_args[@]}" "${wheel_args[@]}" -t "$IMAGE" \
  -f container/Dockerfile . >"$RUN_DIR/image-build.log" \
  || { tail -30 "$RUN_DIR/image-build.log" >&2; die "building $IMAGE failed"; }
step_done
step "building $MWMS_IMAGE (WITH_HOROVOD=0, for distribution tf-mwms) FROM $base"
build --volume "$CA_BUNDLE:$CA_BUNDLE:ro" --ignorefile container/Dockerfile.dockerignore --build-arg "BASE_IMAGE=$base" \
  --build-arg WITH_HOROVOD=0 -t "$MWMS_IMAGE" -f container/Dockerfile . >"$RUN_DIR/mwms-image-build.log" \
  || { tail -30 "$RUN_DIR/mwms-image-build.log" >&2; die "building $MWMS_IMAGE failed"; }
step_done
step "building $TORCH_IMAGE (FRAMEWORK=torch, for distribution torchrun) FROM $torch_base"
build --volume "$CA_BUNDLE:$CA_BUNDLE:ro" --ignorefile container/Dockerfile.dockerignore \
  --build-arg "BASE_IMAGE=$torch_base" --build-arg FRAMEWORK=torch --build-arg WITH_HOROVOD=0 \
  -t "$TORCH_IMAGE" -f container/Dockerfile . >"$RUN_DIR/torch-image-build.log" \
  || { tail -30 "$RUN_DIR/torch-image-build.log" >&2; die "building $TORCH_IMAGE failed"; }
step_done
[ "$build_only" = 1 ] && exit 0

# 4. Jobs in the image: the demo on 2 MPI ranks, a failing rank, a job stopped at its time limit; then
# several hosts, one container each on a private network (test_cluster_image.py: the 2 x 2 demo, tf-mwms
# on 2 hosts, torchrun 2 x 2, a dead worker, a rank raising on algo-2 (Horovod and torchrun), no SSH
# key, the time limit, Ctrl-C). The tests marked `image` (deselected in the main suite, where no image is
# configured).
step "jobs in $IMAGE (tests/container/ -m image)"
SAGEMAKER_DIST_TEST_IMAGE="$IMAGE" SAGEMAKER_DIST_TEST_MWMS_IMAGE="$MWMS_IMAGE" \
  SAGEMAKER_DIST_TEST_TORCH_IMAGE="$TORCH_IMAGE" .venv/bin/python -m pytest -q -p no:cacheprovider \
  -m image --durations=0 tests/container/test_container_image.py tests/container/test_cluster_image.py "$@"
step_done
