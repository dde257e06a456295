"""The registry of platforms: every job command runs through its platform's row (render, submit, wait)
and ``tune`` picks a row by its option; a new platform is a row, its command and tune option following."""

from __future__ import annotations

import pytest

from sagemaker_dist.cli import build_parser, main
from sagemaker_dist.cli.platforms import REGISTRY, Platform, platform, run_job
from sagemaker_dist.errors import ConfigurationError

PROTOCOL = [n for n in vars(Platform) if not n.startswith("_")] + list(Platform.__annotations__)


def _commands() -> dict:
    parser = build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices


def test_every_platform_is_a_row_of_the_protocol_and_runs_its_command():
    commands = _commands()
    assert list(REGISTRY) == ["sagemaker", "local", "k8s", "slurm"]
    for name, row in REGISTRY.items():
        assert row.name == name and platform(name) is row
        missing = [attr for attr in PROTOCOL if not hasattr(row, attr)]
        assert missing == [], f"{name} lacks {missing}"
        defaults = commands[row.command]._defaults
        assert defaults["func"] is run_job and defaults["platform"] == name


def test_an_unknown_platform_is_refused_by_name():
    with pytest.raises(ConfigurationError, match="no platform 'torchx': one of sagemaker, local, k8s, slurm"):
        platform("torchx")


class _Echo:
    """A platform of a test's own: the job is its --say option, echoed back."""

    name = "echo"
    command = "echo"
    tune_option = "--echo"
    tune_help = "tune by echoing"
    tune_only = {"loud": "--loud is for tune --echo"}

    def __init__(self):
        self.calls = []

    def register(self, subparsers):
        p = subparsers.add_parser("echo", help="echo a job")
        p.add_argument("--say", required=True)
        return p

    def add_tune_options(self, p) -> None:
        p.add_argument("--loud", action="store_true")

    def render(self, args, stack):
        self.calls.append(("render", args.say))
        return None if args.say == "dry" else args.say.upper()

    def submit(self, args, job):
        self.calls.append(("submit", job))
        return f"handle-{job}"

    def wait(self, args, handle) -> int:
        self.calls.append(("wait", handle))
        return 7

    def tune(self, args, job_args, spec) -> int:
        self.calls.append(("tune", job_args.say, args.loud, spec.objective_metric))
        return 3


def test_a_new_platform_is_a_row_its_command_and_tune_option_follow(monkeypatch, capsys):
    echo = _Echo()
    monkeypatch.setitem(REGISTRY, "echo", echo)
    assert main(["echo", "--say", "hi"]) == 7
    assert echo.calls == [("render", "hi"), ("submit", "HI"), ("wait", "handle-HI")]
    echo.calls.clear()
    assert main(["echo", "--say", "dry"]) == 0  # rendered, and nothing more to do
    assert echo.calls == [("render", "dry")]
    echo.calls.clear()
    search = ["tune", "--objective-metric", "loss", "--range", "lr=0.1:1", "--max-jobs", "2"]
    assert main([*search, "--echo", "--loud", "--say", "x"]) == 3
    assert echo.calls == [("tune", "x", True, "loss")]
    capsys.readouterr()
    assert main([*search, "--loud", "--dry-run"]) == 2  # another platform's option of tune
    assert "error: --loud is for tune --echo" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one platform at a time
        main([*search, "--echo", "--local"])
    assert "argument --local: not allowed with argument --echo" in capsys.readouterr().err


def test_tune_parses_the_job_with_the_platforms_own_command(capsys):
    search = ["tune", "--objective-metric", "loss", "--range", "lr=0.1:1", "--max-jobs", "2"]
    for option, required in (("--local", "--demo --request --entry-point"), ("--k8s", "--demo --request")):
        with pytest.raises(SystemExit):
            main([*search, option])
        err = capsys.readouterr().err
        assert f"sagemaker-dist tune {option}: error: one of the arguments {required} is required" in err
