#!/usr/bin/env bash
# Build the training image (container/Dockerfile, unchanged but for build args) on a stand-in for the
# AWS TensorFlow DLC, then run jobs in it the way SageMaker does: `podman run <image> train` with the
# host's /opt/ml tree bind-mounted, Pipe FIFOs fed from S3 by local mode, 2 MPI ranks started by the
# image's own toolkit (tests/container/test_container_image.py). Idempotent; prints each step's time.
#
# Usage: scripts/container-test.sh [--base IMAGE] [--build-only] [-- pytest args]
#   --base IMAGE  build FROM this image (already in the podman storage below, e.g. a DLC you pulled)
#                 instead of the stand-in: debootstrap's bookworm minbase + container/standin-base
#   --build-only  build the image, run no job
# Needs root. Installs Debian's podman, buildah, runc and debootstrap with apt-get when missing.
# Cached outside the repository, in ${SAGEMAKER_DIST_CACHE:-~/.cache/sagemaker-dist}/podman: the
# debootstrap tarball and podman's image storage (the stand-in keyed by a hash of its Dockerfile,
# build layers). The Horovod wheel scripts/setup.sh built for the same TF, Python and Open MPI is
# installed instead of compiling Horovod in the image, when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${SAGEMAKER_DIST_TEST_IMAGE:-localhost/sagemaker-dist:test}
MWMS_IMAGE=${IMAGE}-mwms  # the same Dockerfile with WITH_HOROVOD=0
ROOTFS_IMAGE=localhost/sagemaker-dist-bookworm-minbase:latest
STANDIN_REPO=localhost/sagemaker-dist-standin
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
CACHE_ROOT=${SAGEMAKER_DIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sagemaker-dist}
PODMAN_HOME="$CACHE_ROOT/podman"

die() {
  echo "container-test.sh: $*" >&2
  exit 2
}

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
}

base=""
build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="${2:?--base needs an image name}"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

step_started=0
step() {
  step_started=$SECONDS
  echo "== $*"
}
step_done() {
  echo "   done in $((SECONDS - step_started)) s"
}

[ "$(id -u)" = 0 ] || die "needs root (podman with runc and host networking, as set up here)"
[ -x .venv/bin/python ] || bash scripts/setup.sh
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
  command -v apt-get >/dev/null || die "install podman, buildah, runc and debootstrap"
  step "installing podman, buildah, runc, debootstrap (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    podman buildah runc debootstrap >/dev/null
  step_done
fi

# podman's settings, all of its own: runc (crun refuses this kernel's hybrid cgroup layout), limits
# within the hard ones, host networking (the S3 endpoint is on this machine), storage in the cache,
# its run-time state in a private dir under /run keyed by the storage it belongs to.
mkdir -p "$PODMAN_HOME"
PODMAN_HOME=$(cd "$PODMAN_HOME" && pwd)
exec 9>"$PODMAN_HOME/lock"
flock -n 9 || { echo "waiting for another container-test.sh using $PODMAN_HOME"; flock 9; }
RUN_DIR="/run/sagemaker-dist-podman-$(printf '%s' "$PODMAN_HOME" | sha256sum | cut -c1-12)"
mkdir -p "$RUN_DIR/tmp"
cat >"$RUN_DIR/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$RUN_DIR/events.log"
tmp_dir = "$RUN_DIR/libpod"
EOF
cat >"$RUN_DIR/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$PODMAN_HOME/storage"
runroot = "$RUN_DIR/storage"
EOF
export CONTAINERS_CONF="$RUN_DIR/containers.conf" CONTAINERS_STORAGE_CONF="$RUN_DIR/storage.conf"
export TMPDIR="$RUN_DIR/tmp"

# What podman leaves outside its own dirs: /var/lib/containers/cache and empty libpod_parent
# cgroups. Removed at exit when this run made them; so is the run-time dir.
had_var_lib_containers=0
[ -e /var/lib/containers ] && had_var_lib_containers=1
had_cgroups=0
compgen -G "/sys/fs/cgroup/*/libpod_parent" >/dev/null && had_cgroups=1
cleanup() {
  podman rm --all --force --time 3 >/dev/null 2>&1 || true
  while read -r _ mountpoint _; do
    case "$mountpoint" in "$RUN_DIR"/*) umount -l "$mountpoint" 2>/dev/null || true ;; esac
  done </proc/mounts
  rm -rf "$RUN_DIR"
  if [ "$had_var_lib_containers" = 0 ]; then
    rm -rf /var/lib/containers/cache
    rmdir /var/lib/containers 2>/dev/null || true
  fi
  if [ "$had_cgroups" = 0 ]; then
    for parent in /sys/fs/cgroup/*/libpod_parent; do
      [ -d "$parent" ] && find "$parent" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  fi
}
trap cleanup EXIT

build() {
  podman build --format docker --layers "$@"
}

if [ -z "$base" ]; then
  # 1. Debian bookworm minbase, with ca-certificates from the start: the builds below mount this
  # machine's CA bundle over it for pip, which no step may then install.
  if ! podman image exists "$ROOTFS_IMAGE"; then
    tarball="$PODMAN_HOME/bookworm-minbase.tar"
    if [ ! -f "$tarball" ]; then
      step "debootstrap --variant=minbase bookworm ($DEBIAN_MIRROR)"
      rootfs="$RUN_DIR/rootfs"
      rm -rf "$rootfs"
      debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$DEBIAN_MIRROR" \
        >"$RUN_DIR/debootstrap.log" || { tail -20 "$RUN_DIR/debootstrap.log" >&2; die "debootstrap failed"; }
      tar -C "$rootfs" -cf "$tarball.partial" . && mv "$tarball.partial" "$tarball"
      rm -rf "$rootfs"
      step_done
    fi
    step "podman import $tarball as $ROOTFS_IMAGE"
    podman import --quiet "$tarball" "$ROOTFS_IMAGE" >/dev/null
    step_done
  fi
  # 2. The stand-in for the DLC, tagged with a hash of its Dockerfile (older ones are removed).
  standin_key=$(sha256sum container/standin-base/Dockerfile | cut -c1-16)
  base="$STANDIN_REPO:$standin_key"
  if ! podman image exists "$base"; then
    step "building the stand-in DLC $base (apt, TensorFlow, the toolkit)"
    build --volume "$CA_BUNDLE:$CA_BUNDLE:ro" --build-arg "ROOTFS_IMAGE=$ROOTFS_IMAGE" -t "$base" \
      -f container/standin-base/Dockerfile container/standin-base >"$RUN_DIR/standin-build.log" \
      || { tail -30 "$RUN_DIR/standin-build.log" >&2; die "building the stand-in failed"; }
    step_done
  fi
  podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=$STANDIN_REPO" \
    | { grep -vxF "$base" || true; } | xargs -r podman rmi >/dev/null 2>&1 || true
elif ! podman image exists "$base"; then
  die "base image $base is not in podman's storage ($PODMAN_HOME/storage). Run without --base to build \
the stand-in for the TensorFlow DLC, or put $base there first (podman pull / podman load, with \
CONTAINERS_STORAGE_CONF pointing at a storage.conf with graphroot = \"$PODMAN_HOME/storage\")"
fi

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
[ "$build_only" = 1 ] && exit 0

# 4. Jobs in the image: the demo on 2 MPI ranks, a failing rank, a job stopped at its time limit.
step "jobs in $IMAGE (tests/container/test_container_image.py)"
SAGEMAKER_DIST_TEST_IMAGE="$IMAGE" SAGEMAKER_DIST_TEST_MWMS_IMAGE="$MWMS_IMAGE" .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/container/test_container_image.py "$@"
step_done
