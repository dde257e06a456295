"""Our model of AWS's sagemaker-training toolkit against the real one: the arguments a script receives
and the SM_* variables it sees, for hyperparameters that the toolkit (and its /bin/sh) would change."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagemaker_dist.contract.hyperparameters import encode_all
from sagemaker_dist.contract.shell_words import ShellSyntaxError, shell_words
from sagemaker_dist.contract.toolkit import (
    changed_hyperparameters,
    script_argv,
    toolkit_args,
    user_environment,
)

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "helpers" / "toolkit_probe.py"
TOOLKIT_PYTHON = Path(
    os.environ.get("SAGEMAKER_DIST_TOOLKIT_PYTHON") or REPO / ".venv-toolkit" / "bin" / "python"
)

# Values the toolkit (json-decode, str(), sort, -k, then /bin/sh) hands the script changed; some it keeps.
TRICKY = {
    "flag": True,
    "off": False,
    "epochs": 3,
    "lr": 1.50,
    "lr_text": "1.50",
    "ratio": 1e-5,
    "layers": [256, 256],
    "nested": {"z": "y", "k": 1},
    "name": "a b $HOME",
    "quoted": '"double quoted" words',
    "dollar": "x$SAGEMAKER_DIST_NOT_SET-y",
    "brace": "${HOME}/data",
    "tilde": "~/data",
    "star": "*.nomatch",
    "unicode": "héllo wörld ✓",
    "k": "one letter key",
    "empty": "",
    "none": None,
    "backslash": "a\\b c",
    "json_text": '{"a": 1}',
    "csv": "256,256",
    "zz_comment": "#tag and the rest",  # sorted last: a comment swallows what follows it
}


def _probe(tmp_path: Path, stored: dict[str, str], env: dict[str, str]) -> dict:
    if not TOOLKIT_PYTHON.is_file():
        pytest.skip(f"no sagemaker-training virtual environment at {TOOLKIT_PYTHON}; run scripts/setup.sh")
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (config / "inputdataconfig.json").write_text("{}")
    (config / "hyperparameters.json").write_text(json.dumps({**stored, "sagemaker_program": "train.py"}))
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [str(TOOLKIT_PYTHON), str(PROBE), str(tmp_path), str(out)], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        return {"failed": proc.stderr}
    return json.loads(out.read_text())


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_BASE"))}


def test_script_arguments_and_variables_match_the_real_toolkit(tmp_path):
    stored = encode_all(TRICKY)  # what SageMaker stores: every value a string
    env = _env()
    real = _probe(tmp_path, stored, env)
    assert "failed" not in real, real
    assert toolkit_args(stored) == real["cmd_args"]
    assert script_argv(stored, "4.8.3", env, str(tmp_path)) == real["received"]
    assert user_environment(stored) == real["env"]
    # the table does change things: the list is split, $HOME expanded, the comment swallows its words
    assert ["--layers", "[256,", "256]"] == real["received"][real["received"].index("--layers") :][:3]
    assert env["HOME"] in real["received"] and "#tag" not in " ".join(real["received"])
    assert script_argv(stored, "5.1.4", env) == real["cmd_args"]  # 5.x runs no shell


def test_an_unterminated_quote_breaks_the_real_toolkits_command_and_ours_says_so(tmp_path):
    stored = encode_all({"name": "it's"})
    assert "failed" in _probe(tmp_path, stored, _env())
    with pytest.raises(ShellSyntaxError, match="unterminated single quote"):
        script_argv(stored)
    [problem] = changed_hyperparameters(stored)
    assert "'name'" in problem and "broken command line" in problem


def test_changed_hyperparameters_name_the_key_what_arrives_and_the_way_out():
    stored = encode_all({"train_records_per_rank": [256, 256], "epochs": 3, "csv": "256,256", "flag": True})
    problems = changed_hyperparameters(stored)
    assert len(problems) == 2, problems
    lists = next(p for p in problems if "'train_records_per_rank'" in p)
    assert "'[256,' '256]'" in lists and "/bin/sh" in lists and "'256,256'" in lists
    assert any("'flag'" in p and "'True'" in p for p in problems)
    assert changed_hyperparameters(encode_all({"epochs": 3, "csv": "256,256", "name": "x"})) == []


# Characters that make sh quoting, expansion and splitting interesting (no command substitution).
_SH_TEXT = st.text(alphabet="ab $'\"\\~*#x_{}\t=,.é", max_size=14)


@settings(
    max_examples=int(os.environ.get("SHELL_EXAMPLES", "80")),  # 1,500 in a longer run: all equal
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(words=st.lists(_SH_TEXT, max_size=4))
def test_shell_words_is_what_bin_sh_passes(words, tmp_path):
    line = " ".join(words)
    env = {"HOME": "/home/someone", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "xa": "1 2"}
    dump = f"{shlex.quote(sys.executable)} -c 'import json,sys; print(json.dumps(sys.argv[1:]))'"
    proc = subprocess.run(
        ["/bin/sh", "-c", f"{dump} {line}"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    try:
        model = shell_words(line, env, str(tmp_path))
    except ShellSyntaxError:
        return  # refused: what we cannot model (or what sh refuses) is reported, never guessed
    assert proc.returncode == 0, (line, proc.stderr)
    assert model == json.loads(proc.stdout), line


# what the toolkit writes from the config files alone (not the machine's CPUs, GPUs or the job's own
# settings, which local mode takes from the request)
SAME_AS_THE_TOOLKIT = (
    "SM_HOSTS", "SM_CURRENT_HOST", "SM_CHANNELS", "SM_INPUT_DATA_CONFIG", "SM_RESOURCE_CONFIG",
    "SM_CHANNEL_TRAIN_0", "SM_CHANNEL_EVAL", "SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "SM_OUTPUT_DIR",
    "SM_INPUT_DIR", "SM_INPUT_CONFIG_DIR", "SM_NETWORK_INTERFACE_NAME", "SM_CURRENT_INSTANCE_TYPE",
    "SM_HPS", "SM_USER_ARGS", "SM_HP_EPOCHS",
)  # fmt: skip


def test_each_hosts_variables_are_written_as_the_toolkit_writes_them(tmp_path):
    """Local mode's model of the SM_* variables (``host.lifecycle``) for a tree of two hosts, against what
    the real toolkit writes reading that tree's config files: the same strings, JSON spacing included."""
    from sagemaker_dist.contract.layout import plan_layout
    from sagemaker_dist.contract.training_request import ChannelSpec
    from sagemaker_dist.host.lifecycle import build_host_trees

    if not TOOLKIT_PYTHON.is_file():
        pytest.skip(f"no sagemaker-training virtual environment at {TOOLKIT_PYTHON}; run scripts/setup.sh")
    channels = [
        {
            "ChannelName": "train_0",
            "InputMode": "Pipe",
            "DataSource": {"S3DataSource": {"S3Uri": "s3://b/t"}},
        },
        {
            "ChannelName": "eval",
            "InputMode": "FastFile",
            "DataSource": {"S3DataSource": {"S3Uri": "s3://b/e"}},
        },
    ]
    hps = {"epochs": 3, "name": "a b", "sagemaker_dist_layout": plan_layout(2, 1).to_json()}
    specs = [ChannelSpec.from_request(c) for c in channels]
    tree = build_host_trees(tmp_path, ["algo-1", "algo-2"], specs, hps, instance_type="ml.g5.2xlarge")[1]
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [str(TOOLKIT_PYTHON), str(PROBE), str(tree.root), str(out)],
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = json.loads(out.read_text())["all"]
    ours = {name: tree.env.get(name) for name in SAME_AS_THE_TOOLKIT}
    assert ours == {name: real.get(name) for name in SAME_AS_THE_TOOLKIT}
