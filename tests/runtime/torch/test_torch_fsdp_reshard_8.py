"""A sharded checkpoint of 4 ranks resumed on 8: real ``torchrun`` jobs on Gloo (the CPU).

``fsdp_pipe_script.py``'s small MLP: 4 ranks train an epoch and checkpoint it; a new job of 8 ranks with
the same checkpoint directory resumes from it, DCP resharding every parameter and moment into slices
half as large (the last layer's single output row lies whole on one rank, the others' slices empty).
4 -> 2 and 2 -> 4 are in ``test_torch_fsdp_jobs.py``.
"""

from __future__ import annotations

import shutil

import pytest
from helpers.torchrun_job import run_torchrun
from test_torch_fsdp_jobs import SCRIPT, assert_same_state, feed, job_root, state

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def four_then_eight(tmp_path_factory):
    base = tmp_path_factory.mktemp("fsdp-reshard-8")
    four = job_root(base / "four", 4)
    by_four = run_torchrun(SCRIPT, four, base / "out-4", feed(4, 1), nproc=4, TEST_EPOCHS="1", timeout=240)
    eight = job_root(base / "eight", 8)
    shutil.copytree(four / "checkpoints", eight / "checkpoints")  # a new job, the same checkpoint prefix
    on_eight = run_torchrun(SCRIPT, eight, base / "out-8", feed(8, 1), nproc=8, TEST_EPOCHS="2", timeout=360)
    return by_four, on_eight


def test_a_checkpoint_of_4_ranks_resumes_on_8_with_equal_state(four_then_eight):
    by_four, on_eight = four_then_eight
    assert by_four.proc.returncode == 0, by_four.output[-4000:]
    assert on_eight.proc.returncode == 0, on_eight.output[-4000:]
    for rank in range(8):
        (restored,) = on_eight.events(rank, "restored")
        assert restored["resumed_at"] == [1, 0] and restored["world_size"] == 8
        assert restored["lr_step"] == 5
        assert restored["state"] == {"batches_seen": 5}
        assert on_eight.events(rank, "epoch_end")  # and it trained the next epoch on 8
    assert_same_state(state(by_four.out / "state-final.pt"), state(on_eight.out / "state-restored.pt"))
