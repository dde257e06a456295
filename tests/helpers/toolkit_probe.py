"""Run inside a virtual environment with AWS's sagemaker-training: what the real toolkit hands a script.

Usage: python toolkit_probe.py BASE_DIR OUT_JSON. BASE_DIR holds input/config/*.json (the toolkit reads
them from $SAGEMAKER_BASE_DIR). The script's arguments are captured by running this same file as the
"user script" through the toolkit's own ``process.check_error`` (4.8.3: joined and run by /bin/sh).
``env`` holds the hyperparameter variables, ``all`` every variable the toolkit sets for the script.
"""

import json
import os
import sys


def main() -> None:
    base, out = sys.argv[1], sys.argv[2]
    os.environ["SAGEMAKER_BASE_DIR"] = base
    from sagemaker_training import environment, process  # noqa: PLC0415 - after SAGEMAKER_BASE_DIR

    env = environment.Environment()
    argv_file = out + ".argv"
    cmd = [sys.executable, os.path.abspath(__file__), "--dump", argv_file, *env.to_cmd_args()]
    process.check_error(cmd, [], 1, capture_error=True, cwd=base)
    with open(argv_file) as f:
        received = json.load(f)
    variables = env.to_env_vars()
    wanted = {k: v for k, v in variables.items() if k in ("SM_HPS", "SM_USER_ARGS") or k.startswith("SM_HP_")}
    with open(out, "w") as f:
        json.dump({"cmd_args": env.to_cmd_args(), "received": received, "env": wanted, "all": variables}, f)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dump"]:
        with open(sys.argv[2], "w") as f:
            json.dump(sys.argv[3:], f)
    else:
        main()
