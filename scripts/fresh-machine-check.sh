#!/usr/bin/env bash
# The README's quick start on a fresh machine: a privileged podman container made from a bare Debian 12
# (debootstrap's bookworm minbase, as scripts/container-test.sh makes its base) with only git and python3
# added, a git clone of this checkout's HEAD in it, then the README's two commands as a new user runs
# them (its /tmp is on the container's own overlay root, as in any container a user starts: no volume):
#   ./scripts/setup.sh && .venv/bin/sagemaker-dist local --demo
#   ./scripts/test.sh            (the whole suite, under CI=true: a skipped test fails)
# Prints each step's time and each command's exit status; exits non-zero if either command fails. Run by
# hand before resolving an issue (not in CI: it takes 30 to 40 minutes on 2 cores from cold).
#
# Usage: scripts/fresh-machine-check.sh [--warm] [--keep]
#   --warm  mount this machine's Horovod wheel cache (read-only) and pip cache into the container, so
#           the set-up skips the Horovod build and most downloads. Default: no build cache at all.
#   --keep  keep the scratch directory (the clone, its venvs, and a copy of the container's /tmp) for a
#           look afterwards
# Needs root. Installs Debian's podman, buildah, runc, debootstrap and catatonit when missing. podman's
# settings are scripts/lib/podman-env.sh's, its storage ${SAGEMAKER_DIST_CACHE:-~/.cache/sagemaker-dist}/
# podman-fresh (apart from container-test.sh's, so that the two can run at once); the debootstrap tarball
# is shared. The container reaches PyPI and Debian as this machine does: host networking, this
# machine's extra CA certificates, its proxy and pip certificate settings.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/podman-env.sh

warm=0
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --warm) warm=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) podman_die "unknown argument: $1 (see --help)" ;;
  esac
done

# Bounds, in seconds, on each step inside the container.
PREPARE_LIMIT=${FRESH_PREPARE_LIMIT:-1200}
SETUP_LIMIT=${FRESH_SETUP_LIMIT:-3600}
TEST_LIMIT=${FRESH_TEST_LIMIT:-5400}

total_started=$SECONDS
podman_tools
if [ ! -x /usr/libexec/podman/catatonit ]; then
  # an init for the container, reaping the daemons the suite starts and leaves (as a real machine's does)
  step "installing catatonit (apt-get)"
  timeout 900 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 catatonit >/dev/null
  step_done
fi
podman_env "$SAGEMAKER_DIST_CACHE_ROOT/podman-fresh"
scratch=$(mktemp -d /var/tmp/sagemaker-dist-fresh.XXXXXX)
name="sagemaker-dist-fresh-$$"
cleanup() {
  if [ "$keep" = 1 ]; then podman cp "$name:/tmp/." "$scratch/tmp/" >/dev/null 2>&1 || true; fi
  podman_cleanup
  if [ "$keep" = 1 ]; then echo "kept $scratch"; else rm -rf "$scratch"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
podman_rootfs_image

# The clone's source: this checkout's HEAD (committed work only), as a bundle.
branch=$(git symbolic-ref -q --short HEAD || true)
commit=$(git rev-parse --short HEAD)
mkdir -p "$scratch/src" "$scratch/root" "$scratch/tmp" "$scratch/ca"
git bundle create "$scratch/src/repo.bundle" "${branch:-HEAD}" 2>/dev/null
chmod 1777 "$scratch/tmp"

# How this machine reaches PyPI and Debian, passed in: its extra CA certificates (a TLS-inspecting proxy's),
# proxy variables, pip's certificate and timeout settings, apt's proxy.
env_args=()
for variable in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY PIP_CERT PIP_DEFAULT_TIMEOUT \
  PIP_INDEX_URL PIP_TRUSTED_HOST REQUESTS_CA_BUNDLE SSL_CERT_FILE CURL_CA_BUNDLE GIT_SSL_CAINFO; do
  [ -n "${!variable:-}" ] && env_args+=(--env "$variable=${!variable}")
done
find /usr/local/share/ca-certificates -name '*.crt' -exec cp {} "$scratch/ca/" \; 2>/dev/null || true
apt-config dump 2>/dev/null | grep -Ei '^Acquire::https?::Proxy ' >"$scratch/ca/apt-proxy.conf" || true

# No volume on /tmp: there it is on the container's overlay root, where an overlay's upper dir cannot lie
# (the toolkit launcher's mounts must cope, as in a user's container; a /tmp volume hid that).
mounts=(--volume "$scratch/src:/src:ro" --volume "$scratch/ca:/run/host-ca:ro"
  --volume "$scratch/root:/root")
# The local wheels pip finds on a machine of this kind (PIP_FIND_LINKS: the CPU build of torch lies
# there, where PyPI has only the CUDA one), read-only at the same path, as pip's other settings are.
for links in ${PIP_FIND_LINKS:-}; do
  [ -d "$links" ] && mounts+=(--volume "$links:$links:ro")
done
[ -n "${PIP_FIND_LINKS:-}" ] && env_args+=(--env "PIP_FIND_LINKS=$PIP_FIND_LINKS")
if [ "$warm" = 1 ]; then
  for wheels in "$SAGEMAKER_DIST_CACHE_ROOT"/horovod-*; do
    [ -d "$wheels" ] && mounts+=(--volume "$wheels:/root/.cache/sagemaker-dist/${wheels##*/}:ro")
  done
  pip_cache=$(pip3 cache dir 2>/dev/null || echo "$HOME/.cache/pip")
  mkdir -p "$pip_cache"
  mounts+=(--volume "$pip_cache:/root/.cache/pip")
  echo "   --warm: this machine's Horovod wheels and pip cache ($pip_cache) are mounted"
fi

step "starting a privileged container from $ROOTFS_IMAGE (bare Debian 12)"
# A host name that resolves, as Debian's installer writes it into /etc/hosts (Gloo needs one).
podman run --detach --name "$name" --privileged --init --hostname fresh-machine --add-host fresh-machine:127.0.1.1 \
  "${mounts[@]}" "${env_args[@]}" "$ROOTFS_IMAGE" sleep infinity >/dev/null
step_done

# in_container LIMIT COMMAND: runs COMMAND (bash) in the container's clone, bounded; prints its status.
in_container() {
  local limit=$1 command=$2 status=0
  timeout --kill-after=30 "$limit" podman exec --workdir "${workdir:-/root}" "$name" bash -c "$command" \
    || status=$?
  [ "$status" = 124 ] && echo "   ran past its ${limit} s limit"
  return "$status"
}

step "machine set-up: this machine's CA certificates and apt proxy; apt-get install git python3"
# shellcheck disable=SC2016  # expanded in the container
in_container "$PREPARE_LIMIT" '
  set -e
  cp /run/host-ca/*.crt /usr/local/share/ca-certificates/ 2>/dev/null && update-ca-certificates >/dev/null 2>&1
  [ -s /run/host-ca/apt-proxy.conf ] && cp /run/host-ca/apt-proxy.conf /etc/apt/apt.conf.d/90proxy
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git python3 >/dev/null
  echo "   $(. /etc/os-release && echo "$PRETTY_NAME"), $(python3 --version), $(git --version)"'
step_done

step "git clone of $commit${branch:+ ($branch)}"
in_container 300 "git clone -q ${branch:+-b $branch} /src/repo.bundle sagemaker-dist 2>&1 | grep -v detached || true
  git -C sagemaker-dist log --oneline -1"
step_done

workdir=/root/sagemaker-dist
setup_status=0
step "./scripts/setup.sh && .venv/bin/sagemaker-dist local --demo"
in_container "$SETUP_LIMIT" './scripts/setup.sh && .venv/bin/sagemaker-dist local --demo' || setup_status=$?
setup_time=$((SECONDS - step_started))
echo "   exit status $setup_status in $setup_time s"

test_status=0
step "./scripts/test.sh (CI=true)"
in_container "$TEST_LIMIT" 'CI=true ./scripts/test.sh' || test_status=$?
test_time=$((SECONDS - step_started))
echo "   exit status $test_status in $test_time s"

echo "== fresh machine, $commit: setup.sh && local --demo: exit $setup_status in $setup_time s;" \
  "test.sh: exit $test_status in $test_time s; $((SECONDS - total_started)) s in all"
[ "$setup_status" = 0 ] && [ "$test_status" = 0 ]
