"""Progress on long SDK-side steps: a bar where someone watches (a terminal; notebooks are covered by
tests/test_notebook.py), nothing in logs and pipes. Real tqdm, real listing and shard writing on the
moto server."""

from __future__ import annotations

import io

from helpers.scripted_handle import ScriptedHandle

from sagemaker_dist import list_objects, plan_shards, write_shards
from sagemaker_dist.aws.progress import in_notebook, progress_bar, watched


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def on_a_terminal(monkeypatch) -> Terminal:
    """stderr as a terminal, set inside the test (pytest's capture resets it after fixtures)."""
    stream = Terminal()
    monkeypatch.setattr("sys.stderr", stream)
    return stream


def _objects(s3, bucket, count=30):
    for i in range(count):
        s3.put_object(Bucket=bucket, Key=f"data/part-{i:03d}", Body=b"x" * (100 + i))
    return f"s3://{bucket}/data/"


def test_nobody_watching_gets_no_bar(s3, bucket, monkeypatch):
    pipe = io.StringIO()  # a log file or a pipe: not a terminal
    monkeypatch.setattr("sys.stderr", pipe)
    assert not watched() and not in_notebook()
    objects = list_objects(_objects(s3, bucket), client=s3)
    plan = plan_shards([(o.key, o.size) for o in objects], 4)
    write_shards(plan, f"s3://{bucket}/data/", f"s3://{bucket}/shards/", client=s3)
    assert pipe.getvalue() == ""


def test_a_terminal_sees_listing_and_manifest_bars(s3, bucket, monkeypatch):
    terminal = on_a_terminal(monkeypatch)
    objects = list_objects(_objects(s3, bucket), client=s3)
    plan = plan_shards([(o.key, o.size) for o in objects], 4)
    write_shards(plan, f"s3://{bucket}/data/", f"s3://{bucket}/shards/", client=s3)
    shown = terminal.getvalue()
    assert f"list s3://{bucket}/data/" in shown and "30 objects" in shown
    assert "write 4 manifests" in shown and "4/4" in shown


def test_waiting_for_a_job_shows_its_status_line_on_a_terminal(monkeypatch):
    terminal = on_a_terminal(monkeypatch)
    statuses = [("InProgress", "Starting"), ("InProgress", "Training"), ("Completed", "Completed")]
    handle = ScriptedHandle(
        {"TrainingJobStatus": a, "SecondaryStatus": b, "SecondaryStatusTransitions": []} for a, b in statuses
    )
    assert handle.wait(poll=0, printer=None) == "Completed"
    shown = terminal.getvalue()
    assert "scripted: InProgress (Training)" in shown and "scripted: Completed (Completed)" in shown


def test_an_explicit_choice_overrides_the_guess(monkeypatch):
    terminal = on_a_terminal(monkeypatch)
    with progress_bar(3, desc="quiet", enabled=False) as bar:
        bar.update(3)
    assert terminal.getvalue() == ""
