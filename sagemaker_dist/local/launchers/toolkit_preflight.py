"""Pre-flight for ``launcher="toolkit"``: before a job starts, do once, in a throwaway namespace, every
mount that ``toolkit_host`` does for a simulated host, and say in one line what is missing where one
fails, naming the launcher to use instead.

What ``toolkit_host`` needs of this machine: root; ``unshare`` and ``mount`` (util-linux, mount);
private mount and PID namespaces with a fresh /proc (``unshare -m -p -f --mount-proc``); an overlay on
``/opt`` and on ``/usr/sbin`` whose upper and work dirs lie on a tmpfs of the host's own namespace (so
the kernel must have overlayfs; a work dir on a container's overlay root is fine); bind mounts of a dir
on ``/opt/ml`` and of a file on ``/etc/hosts``.

Its probe runs ``toolkit_host.prepare_host`` itself as PID 1 of a throwaway ``unshare -m -p -f
--mount-proc``, in a state dir beside where the job's will be, so it tries exactly what a job would;
the mounts vanish with it (a fraction of a second). It imports nothing else of the project, so
``toolkit.check_toolkit_host`` can call it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sagemaker_dist.contract.paths import DEFAULT_ROOT

INSTEAD = "use launcher 'horovodrun' or 'mpirun' instead"
_PROBE_S = 30

# Run as PID 1 of `unshare -m -p -f --mount-proc`: toolkit_host's own set-up of a host, whatever it does.
_PROBE = (
    "import sys; from pathlib import Path; "
    "from sagemaker_dist.local.launchers.toolkit_host import prepare_host; "
    "prepare_host(Path(sys.argv[1]), Path(sys.argv[2]), ['algo-1'])"
)
_MOUNT_FAILED = re.compile(r"toolkit host: mount (?P<args>.*?) (?P<target>/\S*) failed: (?P<why>.*)", re.S)
_STEPS = {
    "/opt": "an overlay mount on /opt",
    DEFAULT_ROOT: f"a bind mount on {DEFAULT_ROOT}",
    "/usr/sbin": "an overlay mount on /usr/sbin",
    "/etc/hosts": "a bind mount on /etc/hosts",
}


def _kernel_has_overlay() -> bool:
    try:
        lines = Path("/proc/filesystems").read_text().splitlines()
        return any(line.split()[-1:] == ["overlay"] for line in lines)
    except OSError:
        return True  # cannot tell: let the mount's own error speak


def _line(what: str) -> str:
    return f"launcher 'toolkit' cannot run here: {what}; {INSTEAD}"


def toolkit_host_problem(work_dir: str | os.PathLike | None = None) -> str | None:
    """None where a toolkit host can be set up here with its overlays in ``work_dir`` (default: the
    temp dir, where a job's work dir goes by default); else one line naming what is missing and the
    launcher to use instead."""
    if os.geteuid() != 0:
        return _line(
            "it needs root (each simulated host mounts its tree at /opt/ml in a private mount namespace)"
        )
    missing = [tool for tool in ("unshare", "mount") if not shutil.which(tool)]
    if missing:
        return _line(
            f"no {' or '.join(missing)} on PATH "
            "(Debian: apt-get install util-linux mount; scripts/setup.sh does)"
        )
    parent = Path(work_dir) if work_dir else Path(tempfile.gettempdir())
    try:
        parent.mkdir(parents=True, exist_ok=True)
        state = Path(tempfile.mkdtemp(prefix="sagemaker-dist-toolkit-preflight-", dir=parent))
    except OSError as exc:
        return _line(f"its work dir {parent} is not writable ({exc.strerror or exc})")
    try:
        (state / "tree").mkdir()
        try:
            probe = subprocess.run(
                ["unshare", "-m", "-p", "-f", "--mount-proc", sys.executable, "-c", _PROBE]
                + [str(state / "tree"), str(state / "namespace")],
                capture_output=True,
                text=True,
                timeout=_PROBE_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return _line(f"`unshare -m -p -f --mount-proc` did not run ({exc})")
        if probe.returncode == 0:
            return None
        stderr = probe.stderr.strip()
        failed = _MOUNT_FAILED.search(stderr)
        if failed is None:
            why = " ".join(stderr.split())[-300:] or f"exit status {probe.returncode}"
            if stderr.startswith("unshare:"):
                return _line(
                    f"no private mount and PID namespaces (`unshare -m -p -f --mount-proc` failed: {why}); "
                    "in a container, run it with --privileged"
                )
            return _line(f"setting up a simulated host failed ({why})")
        target, why = failed["target"], " ".join(failed["why"].split())[:300]
        step = _STEPS.get(target, f"a mount on {target}")
        if "overlay" in failed["args"]:
            if not _kernel_has_overlay():
                return _line(f"{step} failed: this kernel has no overlay file system (modprobe overlay)")
        return _line(f"{step} failed ({why})")
    finally:
        shutil.rmtree(state, ignore_errors=True)
