"""The container contract: config files under a configurable /opt/ml root, SM_* fallbacks, lazy imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.runtime_helpers import write_opt_ml

from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, LayoutError, plan_layout
from sagemaker_dist.runtime.config import ROOT_ENV, ContainerConfig, ContainerConfigError, opt_ml_root


def test_root_comes_from_argument_then_environment_then_default(tmp_path, monkeypatch):
    monkeypatch.delenv(ROOT_ENV, raising=False)
    assert str(opt_ml_root()) == "/opt/ml"
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "env"))
    assert opt_ml_root() == tmp_path / "env"
    assert opt_ml_root(tmp_path / "arg") == tmp_path / "arg"


def test_load_reads_the_three_files_and_decodes_hyperparameters(tmp_path, monkeypatch):
    layout = plan_layout(2, 2)
    write_opt_ml(
        tmp_path,
        {"train_0": "Pipe", "train_1": "Pipe", "train_2": "Pipe", "train_3": "Pipe", "extra": "File"},
        layout=layout,
        hyperparameters={"epochs": 3, "lr": 0.1, "name": "resnet", "sagemaker_program": "train.py"},
        hosts=("algo-1", "algo-2"),
    )
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    config = ContainerConfig.load()
    assert config.root == tmp_path
    assert config.hosts == ["algo-1", "algo-2"] and config.current_host == "algo-1" and config.host_index == 0
    assert config.channels == ["extra", "train_0", "train_1", "train_2", "train_3"]
    assert config.input_mode("train_2") == "Pipe" and config.input_mode("extra") == "File"
    assert config.input_mode("nope") is None
    assert config.hyperparameters["epochs"] == 3 and config.hyperparameters["lr"] == 0.1
    assert config.user_hyperparameters == {"epochs": 3, "lr": 0.1, "name": "resnet"}
    assert config.layout == layout
    assert config.data_dir == tmp_path / "input" / "data"
    assert config.checkpoint_dir == tmp_path / "checkpoints"
    assert config.sources["inputdataconfig.json"] == str(config.config_dir / "inputdataconfig.json")


def test_sm_variables_stand_in_for_missing_files(tmp_path):
    env = {
        "SM_INPUT_DATA_CONFIG": json.dumps({"train_0": {"TrainingInputMode": "Pipe"}}),
        "SM_HPS": json.dumps({"epochs": 2}),
        "SM_CURRENT_HOST": "algo-2",
        "SM_HOSTS": json.dumps(["algo-1", "algo-2"]),
        "SM_NUM_GPUS": "8",
        "SM_MODEL_DIR": "/somewhere/model",
    }
    config = ContainerConfig.load(tmp_path, environ=env)
    assert config.channels == ["train_0"]
    assert config.hyperparameters == {"epochs": 2}
    assert config.current_host == "algo-2" and config.host_index == 1
    assert config.num_gpus == 8
    assert str(config.model_dir) == "/somewhere/model"
    assert config.sources["inputdataconfig.json"] == "$SM_INPUT_DATA_CONFIG"
    assert config.layout is None


def test_nothing_there_gives_an_empty_config_saying_so(tmp_path):
    config = ContainerConfig.load(tmp_path, environ={})
    assert config.channels == [] and config.hosts == ["algo-1"]
    assert set(config.sources.values()) == {"missing"}


def test_bad_json_names_the_file(tmp_path):
    write_opt_ml(tmp_path, ["train_0"])
    (tmp_path / "input" / "config" / "inputdataconfig.json").write_text("{not json")
    with pytest.raises(ContainerConfigError, match=r"inputdataconfig.json is not valid JSON"):
        ContainerConfig.load(tmp_path, environ={})
    (tmp_path / "input" / "config" / "inputdataconfig.json").write_text("[1, 2]")
    with pytest.raises(ContainerConfigError, match="holds a list, expected a JSON object"):
        ContainerConfig.load(tmp_path, environ={})


def test_a_broken_layout_hyperparameter_is_a_clear_error(tmp_path):
    write_opt_ml(tmp_path, ["train_0"], hyperparameters={LAYOUT_HYPERPARAMETER: {"version": 99}})
    with pytest.raises(LayoutError, match="layout version 99"):
        _ = ContainerConfig.load(tmp_path, environ={}).layout


def test_runtime_imports_neither_tensorflow_nor_the_sagemaker_sdk():
    code = (
        "import sys\n"
        "import sagemaker_dist.runtime as rt\n"
        "import sagemaker_dist.runtime.config, sagemaker_dist.runtime.ranks\n"
        "import sagemaker_dist.runtime.framing, sagemaker_dist.runtime.fifo\n"
        "rt.ContainerConfig, rt.RankInfo, rt.check_rank_channels, rt.RecordFormatError\n"
        "roots = ('tensorflow', 'sagemaker', 'horovod')\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in roots)\n"
        "assert not heavy, heavy\n"
        "assert 'PipeModeDataset' in dir(rt)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
