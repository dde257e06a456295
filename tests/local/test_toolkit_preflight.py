"""The toolkit launcher's pre-flight: every mount a simulated host needs, tried once in a throwaway
namespace, and one line naming what is missing and the launcher to use instead where one fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sagemaker_dist.local.launchers import toolkit_preflight
from sagemaker_dist.local.launchers.toolkit_preflight import INSTEAD, toolkit_host_problem

ROOT_AND_UNSHARE = os.geteuid() == 0 and shutil.which("unshare") and shutil.which("mount")
needs_root = pytest.mark.skipif(not ROOT_AND_UNSHARE, reason="needs root, unshare and mount")
_OVERLAY = "toolkit host: mount -t overlay overlay -o lowerdir={0},upperdir=/w/u,workdir=/w/w {0} failed: "


@needs_root
def test_this_machine_can_set_up_a_toolkit_host_and_the_probe_leaves_nothing(tmp_path):
    assert toolkit_host_problem(tmp_path) is None
    assert toolkit_host_problem() is None  # the temp dir, where a job's work dir goes by default
    assert not list(tmp_path.iterdir())
    assert not Path("/opt/ml").exists() or not Path("/opt/ml").is_mount()


@needs_root
def test_a_work_dir_on_an_overlay_passes_the_hosts_state_is_on_a_tmpfs(tmp_path):
    """A container's own root is an overlay, where an overlay's upper dir cannot be; a job's work dir
    there (an overlay mounted here, in a namespace of this test's own) still holds a toolkit host, whose
    overlays' upper dirs are on a tmpfs of its namespace (toolkit_host.prepare_host)."""
    script = (
        'd=$1; mount -t tmpfs tmpfs "$d" && mkdir "$d/l" "$d/u" "$d/w" "$d/m" && '
        'mount -t overlay overlay -o "lowerdir=$d/l,upperdir=$d/u,workdir=$d/w" "$d/m" && '
        'stat -f -c %T "$d/m" && exec "$2" -c "import sys; '
        "from sagemaker_dist.local.launchers.toolkit_preflight import toolkit_host_problem as p; "
        'print(p(sys.argv[1]))" "$d/m"'
    )
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(tmp_path), sys.executable],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["overlayfs", "None"], out.stdout


def test_without_root_it_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    line = toolkit_host_problem()
    assert "needs root" in line and line.endswith(INSTEAD)


def test_without_unshare_the_package_is_named(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "unshare" else f"/usr/bin/{tool}")
    line = toolkit_host_problem()
    assert "no unshare on PATH" in line and "util-linux" in line and line.endswith(INSTEAD)


@pytest.mark.parametrize(
    "stderr, expected",
    [
        ("unshare: unshare failed: Operation not permitted", "no private mount and PID namespaces"),
        (
            _OVERLAY.format("/opt") + "mount: /opt: unknown filesystem type 'overlay'.",
            "an overlay mount on /opt failed: this kernel has no overlay file system",
        ),
        (
            _OVERLAY.format("/usr/sbin") + "mount: /usr/sbin: wrong fs type, bad option",
            "an overlay mount on /usr/sbin failed (mount: /usr/sbin: wrong fs type, bad option)",
        ),
        (
            "toolkit host: mount --bind /w/hosts /etc/hosts failed: mount: /etc/hosts: permission denied.",
            "a bind mount on /etc/hosts failed (mount: /etc/hosts: permission denied.)",
        ),
    ],
)
def test_each_failed_step_is_named(monkeypatch, tmp_path, stderr, expected):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(toolkit_preflight, "_kernel_has_overlay", lambda: "kernel" not in expected)
    failed = subprocess.CompletedProcess([], 1, "", stderr + "\n")
    monkeypatch.setattr(subprocess, "run", lambda command, **kwargs: failed)
    line = toolkit_host_problem(tmp_path)
    assert line.startswith("launcher 'toolkit' cannot run here: ") and expected in line, line
    assert "\n" not in line and line.endswith(INSTEAD)
    assert not list(tmp_path.iterdir())  # the probe's state dir is gone
