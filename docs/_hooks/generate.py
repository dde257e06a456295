"""mkdocs hook: the pages and pictures the site builds from the code and from data, never by hand.

- ``reference/api.md``, at its marker: one mkdocstrings block per public name of the two façades,
  read from the code (``_EXPORTS`` in ``sagemaker_dist/__init__.py``; ``_LAZY`` and ``_SUBMODULES`` in
  ``sagemaker_dist/runtime/__init__.py``) so a name added there is documented without an edit here.
- ``reference/cli.md``, at its marker: ``sagemaker-dist --help`` and every subcommand's, from the
  parser itself.
- ``img/*.png``: the benchmark headline figures (``docs/_data/headline_figures.json``) drawn with
  matplotlib.

Everything is generated in memory (``File.generated``, the pages' markdown): nothing is written into
``docs/``.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sagemaker_dist"
FIGURES = Path(__file__).resolve().parents[1] / "_data" / "headline_figures.json"


def _assigned_literal(path: Path, name: str):
    """The literal value assigned to ``name`` at module level in ``path`` (read, never imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{path}: no module-level {name}")


def public_names() -> dict[str, list[tuple[str, str]]]:
    """Façade -> [(public name, the module that defines it)], as the code lists them."""
    exports = _assigned_literal(PACKAGE / "__init__.py", "_EXPORTS")
    lazy = _assigned_literal(PACKAGE / "runtime" / "__init__.py", "_LAZY")
    submodules = _assigned_literal(PACKAGE / "runtime" / "__init__.py", "_SUBMODULES")
    runtime = [*lazy.items(), *submodules.items()]  # submodules: name -> the module itself
    return {
        "sagemaker_dist": [(name, f"sagemaker_dist.{module}") for name, module in exports.items()],
        "sagemaker_dist.runtime": runtime,
    }


def _is_module(name: str, module: str) -> bool:
    return (
        module.endswith(f".{name}")
        and (PACKAGE / module.split(".", 1)[1].replace(".", "/")).with_suffix(".py").exists()
    )


def _target(name: str, module: str) -> str:
    """The object mkdocstrings documents (and its anchor): the module itself, or the name in it."""
    return module if _is_module(name, module) else f"{module}.{name}"


def api_markdown() -> str:
    facades = public_names()
    lines = []
    titles = {
        "sagemaker_dist": "Launch side: `sagemaker_dist`",
        "sagemaker_dist.runtime": "Container side: `sagemaker_dist.runtime`",
    }
    for facade, names in facades.items():
        lines += [f"## {titles[facade]}", ""]
        lines += ["| name | defined in |", "| --- | --- |"]
        for name, module in names:
            lines.append(f"| [`{name}`](#{_target(name, module)}) | `{module}` |")
        lines.append("")
        for name, module in names:
            lines += [
                f"::: {_target(name, module)}",
                "    options:",
                f"      heading: '{facade}.{name}'",
                f"      toc_label: '{name}'",
                "      heading_level: 3",
                "",
            ]
    return "\n".join(lines)


def cli_markdown() -> str:
    os.environ.setdefault("COLUMNS", "100")
    from sagemaker_dist.cli import build_parser

    parser = build_parser()
    lines = [
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in actions:
        for name, sub in action.choices.items():
            lines += [f"## `sagemaker-dist {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def figures() -> dict[str, bytes]:
    """The headline benchmark figures as PNGs, name -> bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(FIGURES.read_text(encoding="utf-8"))
    out: dict[str, bytes] = {}

    def save(name, fig):
        buffer = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
        plt.close(fig)
        out[name] = buffer.getvalue()

    reader = data["reader_speed"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    sizes = reader["record_sizes"]
    width = 0.8 / len(reader["series"])
    for i, (label, values) in enumerate(reader["series"].items()):
        xs = [x + (i - (len(reader["series"]) - 1) / 2) * width for x in range(len(sizes))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, labels=[f"{v:.2f}x" for v in values], fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(sizes)), sizes)
    ax.set_xlabel("record size")
    ax.set_ylabel("ours is N times as fast")
    ax.set_title(reader["title"], fontsize=10)
    ax.legend(fontsize=7)
    save("reader_speed.png", fig)

    sharding = data["shard_balance"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    series = [("plan_shards", "plan_shards (ours)"), ("round_robin", "round-robin by key (naive)")]
    _paired_bars(ax, sharding, series, "{:.3f}", "largest shard / lower bound", ticks_fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    save("shard_balance.png", fig)

    first = data["time_to_first_record"]
    fig, ax = plt.subplots(figsize=(7, 3.0))
    _paired_bars(ax, first, [("pipe_s", "Pipe mode"), ("file_s", "File mode")], "{:g} s",
                 "seconds to the first record (log)")  # fmt: skip
    ax.set_yscale("log")
    save("time_to_first_record.png", fig)

    spot = data["spot"]
    fig, ax = plt.subplots(figsize=(7, 2.8))
    rounds = [str(r["round"]) for r in spot["rounds"]]
    stop = [r["stop_s"] for r in spot["rounds"]]
    end = [r["end_s"] for r in spot["rounds"]]
    ax.barh(rounds, end, color="tab:gray", label="SIGTERM to the job's end")
    ax.barh(rounds, stop, color="tab:green", label="SIGTERM to the agreed stop + checkpoint")
    limit = spot["limit_s"]
    ax.axvline(limit, color="tab:red", linestyle="--", label=f"SageMaker's limit ({limit} s)")
    ax.set_xscale("log")
    ax.set_xlim(0.1, 300)
    ax.set_xlabel("seconds after SIGTERM (log)")
    ax.set_ylabel("round")
    ax.set_title(spot["title"], fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    save("spot_stop.png", fig)
    return out


# The committed pages (readable on GitHub as they are) hold a marker the build replaces.
MARKERS = {
    "reference/api.md": ("<!-- generated: api -->", api_markdown),
    "reference/cli.md": ("<!-- generated: cli -->", cli_markdown),
}


def on_files(files, config):
    from mkdocs.structure.files import File

    for name, png in figures().items():
        files.append(File.generated(config, f"img/{name}", content=png))
    return files


def on_page_markdown(markdown, page, config, files):
    marker, generate = MARKERS.get(page.file.src_uri, (None, None))
    if marker is None:
        return markdown
    if marker not in markdown:
        raise ValueError(f"docs/{page.file.src_uri} has lost its marker {marker}")
    return markdown.replace(marker, generate())


def _paired_bars(ax, figure: dict, series, fmt: str, ylabel: str, ticks_fontsize=None) -> None:
    """Two labelled bars per dataset of ``figure["datasets"]``; ``series``: [(key, legend)] twice."""
    names = list(figure["datasets"])
    xs = range(len(names))
    for offset, (key, legend) in zip((-0.2, 0.2), series):
        values = [figure["datasets"][n][key] for n in names]
        bars = ax.bar([x + offset for x in xs], values, 0.4, label=legend)
        ax.bar_label(bars, labels=[fmt.format(v) for v in values], fontsize=7)
    ax.set_xticks(list(xs), names, fontsize=ticks_fontsize)
    ax.set_ylabel(ylabel)
    ax.set_title(figure["title"], fontsize=10)
    ax.legend(fontsize=7)
