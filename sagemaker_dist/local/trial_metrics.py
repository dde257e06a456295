"""A local job's per-epoch metrics as data: rank 0's metric line (``contract/metric_line.py``), read where
the job knows which rank printed it, written as one JSON object a line (``{"epoch": 2, "metrics":
{"val_accuracy": 0.7}}``) to a file that local tuning reads while the trial runs. The trial's objective
then reaches the tuner as data, not by scraping the job's printed output."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from sagemaker_dist.contract.metric_line import DEFAULT_METRICS, metric_definitions, read_metrics
from sagemaker_dist.contract.training_request import TrainingRequest


class EpochMetricsWriter:
    """``on_rank_line`` for ``run_local``: each metric line of rank 0 that the request's
    ``MetricDefinitions`` (default: the demo's metrics) read, appended to ``path`` and flushed."""

    def __init__(self, path: str | Path, request: Mapping):
        read = TrainingRequest.parse(request)
        self.definitions = read.metric_definitions or metric_definitions(DEFAULT_METRICS)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()

    def __call__(self, rank: int, text: str) -> None:
        if rank != 0:
            return
        epoch, values = read_metrics(text, self.definitions)
        if values:
            with self.path.open("a") as out:
                out.write(json.dumps({"epoch": epoch, "metrics": values}) + "\n")


class EpochMetricsReader:
    """The records an ``EpochMetricsWriter`` has appended since the last ``read`` (whole lines only)."""

    def __init__(self, path: str | Path):
        self.path, self.offset = Path(path), 0

    def read(self) -> Iterable[tuple[int | None, dict[str, float]]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        records = [json.loads(line) for line in complete.splitlines() if line.strip()]
        return [(r.get("epoch"), {k: float(v) for k, v in r["metrics"].items()}) for r in records]
