# shellcheck shell=bash
# podman set-up shared by scripts/container-test.sh and scripts/fresh-machine-check.sh. Source it, then
# call podman_tools, podman_env DIR and (for the bare Debian base) podman_rootfs_image. Needs root.
#
# podman's settings are all of its own: runc (crun refuses this kernel's hybrid cgroup layout), limits
# within the hard ones, host networking (the S3 endpoint is on this machine, PyPI and Debian are
# reached as this machine reaches them), storage in DIR, its run-time state in a private dir under
# /run keyed by the storage it belongs to. One script at a time per storage (a lock in DIR); what
# podman leaves outside its own dirs is removed at exit.

SAGEMAKER_DIST_CACHE_ROOT=${SAGEMAKER_DIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sagemaker-dist}
# trusted_cache_dir: what is imported and run from the cache, no other user can have written
# shellcheck source=scripts/lib/trusted-cache.sh
. "$(dirname "${BASH_SOURCE[0]}")/trusted-cache.sh"
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# shellcheck disable=SC2034  # used by the scripts that source this
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
# Debian bookworm minbase with ca-certificates (debootstrap), as a podman image; the tarball is cached
# in $SAGEMAKER_DIST_CACHE_ROOT/podman and shared by every storage.
ROOTFS_IMAGE=localhost/sagemaker-dist-bookworm-minbase:latest
ROOTFS_TARBALL="$SAGEMAKER_DIST_CACHE_ROOT/podman/bookworm-minbase.tar"

podman_die() {
  echo "${0##*/}: $*" >&2
  exit 2
}

step_started=0
step() {
  step_started=$SECONDS
  echo "== $*"
}
step_done() {
  echo "   done in $((SECONDS - step_started)) s"
}

# Debian's podman, buildah, runc and debootstrap, with apt-get when missing.
podman_tools() {
  [ "$(id -u)" = 0 ] || podman_die "needs root (podman with runc and host networking, as set up here)"
  if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
    command -v apt-get >/dev/null || podman_die "install podman, buildah, runc and debootstrap"
    step "installing podman, buildah, runc, debootstrap (apt-get)"
    timeout 900 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 1800 apt-get install -y -qq --no-install-recommends \
      -o DPkg::Lock::Timeout=600 podman buildah runc debootstrap >/dev/null
    step_done
  fi
}

# podman_paths DIR: PODMAN_HOME (DIR, where the storage lives, under $SAGEMAKER_DIST_CACHE_ROOT:
# checked by trusted_cache_dir) and RUN_DIR (podman's run-time state, a private dir under /run keyed by
# the storage). Every user of one storage must give podman the same run-time paths: podman records
# them in its database and refuses others.
podman_paths() {
  PODMAN_HOME=$1
  trusted_cache_dir "$SAGEMAKER_DIST_CACHE_ROOT" "$PODMAN_HOME"
  PODMAN_HOME=$(cd "$PODMAN_HOME" && pwd)
  RUN_DIR="/run/sagemaker-dist-podman-$(printf '%s' "$PODMAN_HOME" | sha256sum | cut -c1-12)"
}

# podman_write_conf CONF_DIR EVENTS_LOG: containers.conf and storage.conf for the storage podman_paths
# named. Host networking is the default; a several-host job names its own network per container. The
# networks a job creates are kept with the storage ($PODMAN_HOME/networks), not in /etc/cni/net.d.
podman_write_conf() {
  mkdir -p "$1" "$PODMAN_HOME/networks"
  cat >"$1/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$2"
tmp_dir = "$RUN_DIR/libpod"

[network]
network_config_dir = "$PODMAN_HOME/networks"
EOF
  cat >"$1/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$PODMAN_HOME/storage"
runroot = "$RUN_DIR/storage"
EOF
}

# podman_env DIR: podman's settings and storage under DIR (PODMAN_HOME), its run-time dir (RUN_DIR),
# exported for every podman call that follows; waits (bounded) for another script using DIR.
podman_env() {
  podman_paths "$1"
  exec 9>"$PODMAN_HOME/lock"
  if ! flock -n 9; then
    echo "waiting (up to ${PODMAN_LOCK_WAIT:-3600} s) for another script using $PODMAN_HOME"
    flock -w "${PODMAN_LOCK_WAIT:-3600}" 9 || podman_die "$PODMAN_HOME is still in use; giving up"
  fi
  mkdir -p "$RUN_DIR/tmp"
  podman_write_conf "$RUN_DIR" "$RUN_DIR/events.log"
  export CONTAINERS_CONF="$RUN_DIR/containers.conf" CONTAINERS_STORAGE_CONF="$RUN_DIR/storage.conf"
  export TMPDIR="$RUN_DIR/tmp"
  # What podman leaves outside its own dirs: /var/lib/containers/cache and empty libpod_parent
  # cgroups. Removed at exit when this run made them; so is the run-time dir.
  _podman_had_var_lib_containers=0
  [ -e /var/lib/containers ] && _podman_had_var_lib_containers=1
  _podman_had_cgroups=0
  compgen -G "/sys/fs/cgroup/*/libpod_parent" >/dev/null && _podman_had_cgroups=1
  trap podman_cleanup EXIT
}

# podman_env_lines DIR: the `export` lines that give a shell the settings podman_env gives the scripts,
# for the same storage, from files kept with it ($PODMAN_HOME/env: they outlive a script's run, whose
# run-time dir its exit removes). Takes no lock and removes nothing.
podman_env_lines() {
  podman_paths "$1"
  local conf="$PODMAN_HOME/env"
  mkdir -p "$conf/tmp"
  podman_write_conf "$conf" "$conf/events.log"
  printf 'export CONTAINERS_CONF=%q\n' "$conf/containers.conf"
  printf 'export CONTAINERS_STORAGE_CONF=%q\n' "$conf/storage.conf"
  printf 'export TMPDIR=%q\n' "$conf/tmp"
}

# The EXIT trap podman_env sets: removes this storage's containers and what podman left behind.
podman_cleanup() {
  podman rm --all --force --time 3 >/dev/null 2>&1 || true
  # the private networks of several-host jobs (the label of sagemaker_dist/local/launchers/cluster_plan.py)
  podman network ls --quiet --filter label=sagemaker-dist.cluster 2>/dev/null \
    | xargs -r podman network rm --force >/dev/null 2>&1 || true
  while read -r _ mountpoint _; do
    case "$mountpoint" in "$RUN_DIR"/*) umount -l "$mountpoint" 2>/dev/null || true ;; esac
  done </proc/mounts
  rm -rf "$RUN_DIR"
  if [ "$_podman_had_var_lib_containers" = 0 ]; then
    rm -rf /var/lib/containers/cache
    rmdir /var/lib/containers 2>/dev/null || true
  fi
  if [ "$_podman_had_cgroups" = 0 ]; then
    for parent in /sys/fs/cgroup/*/libpod_parent; do
      [ -d "$parent" ] && find "$parent" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  fi
}

# $ROOTFS_IMAGE in this storage: Debian bookworm minbase with ca-certificates from the start (the
# builds and containers mount this machine's CA bundle over it, which no step may then install).
podman_rootfs_image() {
  podman image exists "$ROOTFS_IMAGE" && return 0
  trusted_cache_dir "$SAGEMAKER_DIST_CACHE_ROOT" "$(dirname "$ROOTFS_TARBALL")"
  if [ ! -f "$ROOTFS_TARBALL" ]; then
    step "debootstrap --variant=minbase bookworm ($DEBIAN_MIRROR)"
    local rootfs="$RUN_DIR/rootfs"
    rm -rf "$rootfs"
    timeout 1200 debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$DEBIAN_MIRROR" \
      >"$RUN_DIR/debootstrap.log" || { tail -20 "$RUN_DIR/debootstrap.log" >&2; podman_die "debootstrap failed"; }
    tar -C "$rootfs" -cf "$ROOTFS_TARBALL.partial.$$" . && mv "$ROOTFS_TARBALL.partial.$$" "$ROOTFS_TARBALL"
    rm -rf "$rootfs"
    step_done
  fi
  step "podman import $ROOTFS_TARBALL as $ROOTFS_IMAGE"
  podman import --quiet "$ROOTFS_TARBALL" "$ROOTFS_IMAGE" >/dev/null
  step_done
}
