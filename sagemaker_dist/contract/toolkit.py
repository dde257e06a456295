"""What AWS's sagemaker-training toolkit (the Deep Learning Containers' entry point) does with the
hyperparameters and a host's tree: the arguments the user script receives and the ``SM_*`` variables
it sees (``sm_environment``).

The toolkit json-decodes every value it can (``environment.read_hyperparameters``), keeps the user's
(not ``sagemaker_*``), sorts the keys, writes ``--key`` (``-k`` for a one-letter key) and turns each
value back into text with ``str()`` (a dict becomes ``k=v,k2=v2``): ``true`` -> ``True``, ``1.50``
-> ``1.5``, ``[256,256]`` -> ``[256, 256]`` (``mapping.to_cmd_args``). Versions before 5 then run
the command through ``/bin/sh`` (``process.run_async``), which re-parses it: ``[256, 256]`` arrives
as two arguments. The TF DLCs carry 4.8.3 (``sagemaker-tensorflow-training`` 20.5.0 pins <= 4.8.3).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sagemaker_dist.contract.hyperparameters import decode_all, user_hyperparameters
from sagemaker_dist.contract.paths import ROOT_ENV
from sagemaker_dist.contract.shell_words import ShellSyntaxError, shell_words
from sagemaker_dist.errors import ConfigurationError

DEFAULT_TOOLKIT_VERSION = "4.8.3"
_BROKEN = "a broken command line"  # how changed_hyperparameters names a line the shell would not run


class ToolkitArgumentWarning(UserWarning):
    """A hyperparameter the image's sagemaker-training toolkit would hand the script changed."""


def runs_through_shell(toolkit_version: str) -> bool:
    """sagemaker-training before 5.0 joins the command and runs it with ``/bin/sh``."""
    major = toolkit_version.split(".", 1)[0]
    if not major.isdigit():
        raise ConfigurationError(f"toolkit version {toolkit_version!r} is not a version like '4.8.3'")
    return int(major) < 5


def _text(value) -> str:
    return "" if value is None else str(value)


def cmd_args(decoded: Mapping) -> list[str]:
    """``mapping.to_cmd_args`` of decoded user hyperparameters: sorted ``--key value`` pairs."""
    args = []
    for key in sorted(decoded):
        name = _text(key)
        flag = ("--" if len(name) > 1 else "-") + name if name else ""
        value = decoded[key]
        if hasattr(value, "items"):
            value = ",".join(f"{k}={v}" for k, v in sorted(value.items()))
        args += [flag, _text(value)]
    return args


def env_value(value) -> str:
    """How the toolkit writes a value into an ``SM_*`` variable: text as is, else compact sorted JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True)
class ScriptHyperparameters:
    """The stored hyperparameters as the toolkit reads them for the script, once: the user's
    (json-decoded, no ``sagemaker_*``) and the argument list it makes of them, before any shell."""

    user: dict[str, Any]
    args: tuple[str, ...]

    @classmethod
    def read(cls, hyperparameters: Mapping[str, str]) -> ScriptHyperparameters:
        user = user_hyperparameters(decode_all(hyperparameters))
        return cls(user, tuple(cmd_args(user)))


def toolkit_args(hyperparameters: Mapping[str, str]) -> list[str]:
    """The toolkit's argument list for the stored (string) hyperparameters, before any shell."""
    return list(ScriptHyperparameters.read(hyperparameters).args)


def script_argv(
    hyperparameters: Mapping[str, str],
    toolkit_version: str = DEFAULT_TOOLKIT_VERSION,
    environ: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> list[str]:
    """The arguments the entry script receives (``sys.argv[1:]``) under that toolkit version.

    Raises ``ShellSyntaxError`` where the toolkit's shell would not pass a plain argument list
    (an unterminated quote, ``;``, ``$(...)``): the job would fail or run something else.
    """
    try:
        return _received_argv(hyperparameters, toolkit_version, environ, cwd)
    except ShellSyntaxError as exc:
        env = {"HOME": "/root"} if environ is None else environ
        broken = [p for p in changed_hyperparameters(hyperparameters, toolkit_version, env) if _BROKEN in p]
        raise ShellSyntaxError(
            "; ".join(broken) or f"the script's command line under /bin/sh: {exc}"
        ) from None


def container_argv(
    hyperparameters: Mapping[str, str], toolkit_version: str = DEFAULT_TOOLKIT_VERSION
) -> list[str]:
    """``script_argv`` in the container (``HOME=/root``), for a platform that renders the command
    itself (Slurm, Kubernetes): each hyperparameter the toolkit's shell would change or cut (a value
    with `` #`` drops every later argument) is a ``ToolkitArgumentWarning`` first, as the estimator gives."""
    env = {"HOME": "/root"}
    for problem in changed_hyperparameters(hyperparameters, toolkit_version, env):
        if _BROKEN not in problem:  # a broken line raises below, with the same sentence
            warnings.warn(problem, ToolkitArgumentWarning, stacklevel=2)
    return script_argv(hyperparameters, toolkit_version, env, None)


def _received_argv(hyperparameters, toolkit_version, environ, cwd) -> list[str]:
    return received_argv(toolkit_args(hyperparameters), toolkit_version, environ, cwd)


def received_argv(
    args: Sequence[str], toolkit_version: str, environ: Mapping[str, str] | None, cwd: str | None
) -> list[str]:
    """What the script receives of the toolkit's argument list ``args`` under that version: the list
    itself, or (a version that runs it through ``/bin/sh``) the words the shell makes of it.
    Raises ``ShellSyntaxError`` where that shell would not pass a plain argument list."""
    if runs_through_shell(toolkit_version):
        return shell_words(" ".join(args), environ, cwd)
    return list(args)


def user_environment(hyperparameters: Mapping[str, str] | ScriptHyperparameters) -> dict[str, str]:
    """``SM_HPS``, ``SM_USER_ARGS`` and ``SM_HP_<KEY>`` as the toolkit sets them (for the stored
    hyperparameters, or as read already)."""
    script = hyperparameters
    if not isinstance(script, ScriptHyperparameters):
        script = ScriptHyperparameters.read(script)
    env = {"SM_HPS": env_value(script.user), "SM_USER_ARGS": env_value(list(script.args))}
    env.update({f"SM_HP_{str(key).upper()}": env_value(value) for key, value in script.user.items()})
    return env


def changed_hyperparameters(
    hyperparameters: Mapping[str, str],
    toolkit_version: str = DEFAULT_TOOLKIT_VERSION,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """One sentence per user hyperparameter the script would not receive as ``--key <stored value>``:
    what it gets instead under that toolkit version, and the way out."""
    env = {"HOME": "/root"} if environ is None else environ  # the container's shell, not this machine's
    out = []
    for key, stored in user_hyperparameters(hyperparameters).items():
        try:
            received = _received_argv({key: stored}, toolkit_version, env, None)
        except ShellSyntaxError as exc:  # the command would fail or do something else
            received_text = f"{_BROKEN} ({exc})"
        else:
            if received == [f"--{key}", stored]:
                continue
            received_text = " ".join(repr(a) for a in received) or "nothing"
        out.append(
            f"hyperparameter {key!r} = {stored!r} reaches the script as {received_text} under the "
            f"sagemaker-training toolkit {toolkit_version} (the TensorFlow DLCs' entry point): it "
            "json-decodes each value and writes it back with str()"
            + (
                ", then re-parses the command line with /bin/sh"
                if runs_through_shell(toolkit_version)
                else ""
            )
            + ". Use a value that survives that (a comma-separated string such as '256,256' instead of a "
            "list; no spaces, quotes, '$' or '#'; a key of two or more characters), or read it from SM_HPS "
            "or hyperparameters.json in the script"
        )
    return out + _dropped_arguments(hyperparameters, toolkit_version, env)


def _dropped_arguments(hyperparameters: Mapping[str, str], toolkit_version: str, env) -> list[str]:
    """The sentence for arguments the shell never passes at all: a `` #`` in one value starts a comment
    that swallows every later ``--key value`` of the sorted line."""
    try:
        received = set(_received_argv(hyperparameters, toolkit_version, env, None))
    except ShellSyntaxError:  # each broken value has its own sentence above
        return []
    flags = [arg for arg in toolkit_args(hyperparameters)[::2] if arg]
    dropped = [flag for flag in flags if flag not in received]
    if not dropped:
        return []
    return [
        f"the script receives no {', '.join(dropped)}: the sagemaker-training toolkit {toolkit_version} "
        "joins the arguments into one /bin/sh command line, where a value with ' #' starts a comment that "
        "drops every later argument. Remove the '#' from that value"
    ]


def sm_environment(
    tree, names, data_config, script: ScriptHyperparameters, resource, num_gpus, job_name
) -> dict[str, str]:
    """The variables the sagemaker-training toolkit sets for the user script, for this host (JSON values
    written as its ``mapping.to_env_vars`` writes them: sorted keys, no spaces); ``script``: the job's
    hyperparameters as the toolkit reads them."""
    env = {
        ROOT_ENV: str(tree.root),  # the runtime's override of the /opt/ml root
        "SM_HOSTS": env_value(names),
        "SM_CURRENT_HOST": tree.name,
        "SM_NUM_GPUS": str(num_gpus),
        "SM_NUM_CPUS": str(os.cpu_count() or 1),
        "SM_CHANNELS": env_value(sorted(data_config)),
        "SM_MODEL_DIR": str(tree.model_dir),
        "SM_OUTPUT_DATA_DIR": str(tree.output_data_dir),
        "SM_OUTPUT_DIR": str(tree.output_dir),
        "SM_INPUT_DIR": str(tree.root / "input"),
        "SM_INPUT_CONFIG_DIR": str(tree.config_dir),
        "SM_INPUT_DATA_CONFIG": env_value(data_config),
        "SM_RESOURCE_CONFIG": env_value(resource),
        "SM_NETWORK_INTERFACE_NAME": resource["network_interface_name"],
        "SM_CURRENT_INSTANCE_TYPE": resource["current_instance_type"],
    }
    for channel in data_config:
        env[f"SM_CHANNEL_{channel.upper()}"] = str(tree.data_dir / channel)
    env.update(user_environment(script))  # SM_HPS, SM_USER_ARGS, SM_HP_<KEY> as the toolkit writes them
    env["SM_TRAINING_ENV"] = env_value(
        {
            "hosts": names,
            "current_host": tree.name,
            "channel_input_dirs": {c: env[f"SM_CHANNEL_{c.upper()}"] for c in data_config},
            "hyperparameters": script.user,
            "job_name": job_name,
            "model_dir": str(tree.model_dir),
            "num_gpus": num_gpus,
        }
    )
    return env
