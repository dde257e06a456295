"""What a local job did: per-rank input figures, final metrics and where its outputs are."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sagemaker_dist.contract.metric_line import EPOCH as METRIC_EPOCH
from sagemaker_dist.contract.metric_line import NUMBER, read_metrics
from sagemaker_dist.contract.metric_line import PREFIX as METRIC_PREFIX
from sagemaker_dist.host.feeder import FeedStats

# Keras progress lines: "loss: 2.1 - accuracy: 0.3"; SageMaker applies MetricDefinitions the same way.
METRIC_PAIR = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)=" + NUMBER)
DEFAULT_METRIC = re.compile(r"\b([A-Za-z_][\w]*): (-?[0-9.]+(?:e[-+]?\d+)?|nan|inf)\b")


@dataclass
class RankSummary:
    rank: int
    host: str
    channel: str | None
    records: int | None
    bytes: int
    first_record_s: float | None
    records_per_s: float | None
    # (seconds from starting the ranks, bytes the rank had read from its train FIFOs): for plots
    read_over_time: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class LocalJobResult:
    """What a local job did, for the summary and for tests."""

    job_name: str
    hosts: int
    processes_per_host: int
    input_mode: str
    seconds: float
    ranks: list[RankSummary]
    metrics: dict[str, float]
    model_uri: str | None
    checkpoint_uri: str | None
    tensorboard_uri: str | None
    work_dir: str | None
    feed_stats: list[FeedStats] = field(default_factory=list)
    output: list[str] = field(default_factory=list)

    def summary_lines(self) -> list[str]:
        lines = [
            f"local job {self.job_name} finished in {self.seconds:.1f} s: {len(self.ranks)} rank(s) = "
            f"{self.hosts} simulated host(s) x {self.processes_per_host} process(es), {self.input_mode} mode",
            f"  {'rank':>4}  {'host':<7} {'channel':<12} {'records':>9} {'MB':>8} {'1st record':>10} "
            f"{'records/s':>10}",
        ]
        for r in self.ranks:
            rec = "?" if r.records is None else str(r.records)
            first = "-" if r.first_record_s is None else f"{r.first_record_s:.2f} s"
            rate = "-" if r.records_per_s is None else f"{r.records_per_s:,.0f}"
            lines.append(
                f"  {r.rank:>4}  {r.host:<7} {r.channel or '-':<12} {rec:>9} {r.bytes / 1e6:>8.2f} "
                f"{first:>10} {rate:>10}"
            )
        if self.input_mode == "Pipe":
            lines.append(
                "  (records: streamed into the rank's train FIFOs, the reader's read-ahead included; 1st "
                "record: seconds from starting the ranks to the first bytes the rank read; records/s: over "
                "its stream)"
            )
        else:  # downloaded before the ranks started: no stream to count
            lines.append("  (MB: the rank's train channel as downloaded; the script read its files itself)")
        if self.metrics:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in self.metrics.items())
            lines.append(f"final metrics (rank 0): {shown}")
        for label, uri in (
            ("model", self.model_uri),
            ("checkpoints", self.checkpoint_uri),
            ("tensorboard", self.tensorboard_uri),
            ("work dir", self.work_dir),
        ):
            if uri:
                lines.append(f"{label}: {uri}")
        return lines


def final_metrics(lines: list[str], definitions: list[dict]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if definitions:  # as SageMaker reads them: the last line that a definition finds wins
        for line in lines:
            metrics.update(read_metrics(line, definitions)[1])
        return metrics
    for line in lines:  # the last line wins, key by key: the helpers' metric line, or Keras progress
        if line.startswith(METRIC_PREFIX):  # the Keras and PyTorch helpers' (contract/metric_line.py)
            for name, value, _ in METRIC_PAIR.findall(line[len(METRIC_PREFIX) :]):
                if name != METRIC_EPOCH:
                    metrics[name] = float(value)
        elif " - " in line and "loss" in line:
            for name, value in DEFAULT_METRIC.findall(line):
                metrics[name] = float(value)
    return metrics


def rank_summaries(trees, layout, feeders, launch_time) -> list[RankSummary]:
    """What each rank of ``trees`` (a ``JobHosts``) read: its host's feed of its train channel."""
    stats = {(f.stats.host, f.stats.channel): f.stats for f in feeders}
    out = []
    for rank in range(trees.world):
        host = trees.host_of(rank)
        channel = None
        if layout is not None and layout.has_role("train"):
            channel = layout.channel_for("train", rank, trees.local_rank(rank))
        elif len({c for h, c in stats if h == host}) == 1:
            channel = next(c for h, c in stats if h == host)
        s = stats.get((host, channel))
        if s is None:
            out.append(RankSummary(rank, host, channel, None, 0, None, None))
            continue
        first = None if s.first_byte is None else s.first_byte - launch_time
        rate = None
        if s.records and s.first_byte and s.last_byte and s.last_byte > s.first_byte:
            rate = s.records / (s.last_byte - s.first_byte)
        read = [(round(t - launch_time, 3), n) for t, n in s.timeline]
        out.append(RankSummary(rank, host, channel, s.records, s.bytes, first, rate, read))
    return out
