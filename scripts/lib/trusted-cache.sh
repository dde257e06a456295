# shellcheck shell=bash
# trusted_cache_dir ROOT [DIR...]: make the cache root ROOT (and each DIR under it) where missing, mode
# 0700, and stop the script, naming the path and the fix, where another user could have written what
# it holds (the Horovod wheels setup.sh installs, the base images and tarballs container-test.sh
# imports): ROOT, each DIR and every folder between them must be a folder (not a link) of this
# user's or root's, not writable by group or others; ROOT's parent must be this user's or root's and
# not writable by group or others unless it is sticky (as /tmp is). The same rule as
# sagemaker_dist/runtime/trusted_cache.py. Linux (GNU stat). Safe under `set -euo pipefail`.

_trusted_cache_refuse() {  # PATH PROBLEM FIX [WHAT]
  local owner mode
  owner=$(stat -c '%U (uid %u)' -- "$1" 2>/dev/null || echo '?')
  mode=$(stat -c '%A (%a)' -- "$1" 2>/dev/null || echo '?')
  echo "${0##*/}: ${4:-the cache folder} $1 (owner $owner, mode $mode) $2: what this script would install" \
    "or run from it could be another user's; $3; or set SAGEMAKER_DIST_CACHE to a folder of your own" >&2
  exit 2
}

# _trusted_cache_check PATH STICKY_OK: refuse PATH unless it is a folder of ours (or root's), not a
# link, not writable by group or others (with STICKY_OK=1: unless sticky).
_trusted_cache_check() {
  local info uid perms what="the cache folder"
  [ "$2" = 0 ] || what="the folder that holds the cache,"
  [ ! -L "$1" ] || _trusted_cache_refuse "$1" "is a symbolic link" "remove the link" "$what"
  [ -d "$1" ] || _trusted_cache_refuse "$1" "is not a folder" "remove it" "$what"
  info=$(stat -c '%u %a' -- "$1")
  uid=${info% *} perms=${info#* }
  if [ "$uid" != "$(id -u)" ] && [ "$uid" != 0 ]; then
    _trusted_cache_refuse "$1" "belongs to another user" "remove it (its owner or root can)" "$what"
  fi
  if (((8#$perms & 8#022) != 0)) && ! { [ "$2" = 1 ] && (((8#$perms & 8#1000) != 0)); }; then
    _trusted_cache_refuse "$1" "is writable by group or others" "run: chmod go-w '$1'" "$what"
  fi
}

_trusted_cache_mkdir() {  # DIR: made 0700 where missing (mkdir -p would follow the umask)
  if [ ! -e "$1" ] && [ ! -L "$1" ]; then
    mkdir -m 700 -- "$1" 2>/dev/null || [ -d "$1" ] || { echo "${0##*/}: cannot create $1" >&2; exit 2; }
  fi
}

trusted_cache_dir() {
  local given=${1:?trusted_cache_dir needs the cache root} root dir above part parts missing=()
  shift
  above=$given
  while [ ! -e "$above" ] && [ ! -L "$above" ]; do
    missing=("$above" "${missing[@]}")
    above=$(dirname -- "$above")
  done
  for dir in "${missing[@]}"; do
    _trusted_cache_mkdir "$dir"
  done
  # links in the root's own path are resolved (a cache root may be a link to a disk of its own)
  root=$(CDPATH='' cd -- "$given" && pwd -P) || { echo "${0##*/}: cannot enter the cache folder $given" >&2; exit 2; }
  _trusted_cache_check "$(dirname -- "$root")" 1
  _trusted_cache_check "$root" 0
  for dir in "$@"; do
    case "$dir" in
      "$given"/*) IFS=/ read -r -a parts <<<"${dir#"$given"/}" ;;
      *) echo "${0##*/}: trusted_cache_dir: $dir is not under $given" >&2; exit 2 ;;
    esac
    dir=$root
    for part in "${parts[@]}"; do
      [ -n "$part" ] || continue
      dir="$dir/$part"
      _trusted_cache_mkdir "$dir"
      _trusted_cache_check "$dir" 0
    done
  done
}
