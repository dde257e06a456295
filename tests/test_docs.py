"""The documentation's cheap checks (scripts/docs.sh builds the site itself, with --strict): the API page
covers every public name and each resolves, the README stays a front page, relative links in the
README and the pages point at files that exist, the code layout page names every module, and no page,
docstring or comment tells the history of its making (that is in git)."""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections import Counter
from pathlib import Path

import sagemaker_dist
import sagemaker_dist.runtime

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Pages the build adds or copies in: the executed notebook (scripts/docs.sh) and the plots (the hook).
BUILT = {"notebooks/horovod_pipe_mode.ipynb", "notebooks/pytorch_pipe_mode.ipynb"}


def _hook():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "_hooks" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_page_lists_every_public_name_and_each_resolves():
    facades = _hook().public_names()
    launch = {name for name, _ in facades["sagemaker_dist"]}
    assert launch == set(sagemaker_dist.__all__) - {"__version__"}
    runtime = {name for name, _ in facades["sagemaker_dist.runtime"]}
    assert set(sagemaker_dist.runtime.__all__) <= runtime
    for facade in facades.values():
        for name, module in facade:
            defined = importlib.import_module(module)
            assert module.endswith(f".{name}") or hasattr(defined, name), (name, module)
    markdown = _hook().api_markdown()
    for facade, names in facades.items():
        for name, _ in names:
            assert f"heading: '{facade}.{name}'" in markdown


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, len(lines)
    text = "\n".join(lines)
    assert "./scripts/setup.sh && .venv/bin/sagemaker-dist local --demo" in text
    assert "./scripts/test.sh" in text
    assert "backend=LocalBackend()" in text


def _links(path: Path):
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:|#", target):
            yield target.split("#", 1)[0]


def test_relative_links_point_at_files():
    pages = [ROOT / "README.md", *DOCS.glob("*.md"), *DOCS.glob("*/*.md")]
    for page in pages:
        for target in _links(page):
            resolved = (page.parent / target).resolve()
            built = resolved.relative_to(DOCS).as_posix() in BUILT if resolved.is_relative_to(DOCS) else False
            assert resolved.exists() or built or target.startswith("img/"), f"{page.name}: {target}"


LAYOUT = DOCS / "reference" / "code-layout.md"


def _layout_sections(text: str) -> dict[str, str]:
    """The page's section of each top-level package: from its bullet (``- `launch/` — ...``) to the next
    top-level bullet, the paragraphs between them included (the registry of platforms is ``cli``'s)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("- "):
            bullet = re.match(r"- `([a-z_]+)/`", line)
            current = bullet.group(1) if bullet else None
            if current:
                sections[current] = []
        if current:
            sections[current].append(line)
    return {package: "\n".join(lines) for package, lines in sections.items()}


def _code_names(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def unnamed_modules(page: str, modules: list[str]) -> list[str]:
    """The modules (paths relative to sagemaker_dist/) the layout page does not name. A module is named by
    its path in backticks anywhere on the page (`runtime/torch/sharded.py`), or within its top-level
    package's section by a shorter path (`torch/sharded.py`) or its file name (`sharded.py`). A file name
    that several modules of the package share (`stop.py`) must appear as often as the modules it stands
    for that no path names."""
    everywhere = set(_code_names(page))
    sections = _layout_sections(page)
    missing = [module for module in modules if "/" not in module and module not in everywhere]
    by_package: dict[str, list[str]] = {}
    for module in modules:
        if "/" in module:
            by_package.setdefault(module.split("/", 1)[0], []).append(module)
    for package, members in by_package.items():
        names = _code_names(sections.get(package, ""))
        bare = Counter(name for name in names if "/" not in name)
        by_file: dict[str, list[str]] = {}
        for module in members:
            parts = module.split("/")[1:]
            paths = {"/".join(parts[start:]) for start in range(len(parts) - 1)}
            if module not in everywhere and not paths & set(names):
                by_file.setdefault(parts[-1], []).append(module)
        missing += [module for name, group in by_file.items() if bare[name] < len(group) for module in group]
    return sorted(missing)


def _package_modules() -> list[str]:
    package = ROOT / "sagemaker_dist"
    return sorted(
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )


def test_the_layout_page_names_every_module():
    missing = unnamed_modules(LAYOUT.read_text(encoding="utf-8"), _package_modules())
    assert not missing, (
        f"{LAYOUT.relative_to(ROOT)} does not name these modules of sagemaker_dist/: {', '.join(missing)}. "
        "Add each where its package is described, in backticks: its path (`runtime/torch/sharded.py`), or "
        "its file name (`sharded.py`) in its top-level package's bullet, with one line on what it is."
    )


def test_the_layout_rule_finds_a_module_the_page_does_not_name():
    page = "- `runtime/` — the core: `stop.py`, `torch/` (`stop.py`, `epochs.py`).\n- `cli/` — `tune.py`.\n"
    modules = ["runtime/stop.py", "runtime/torch/stop.py", "runtime/torch/epochs.py", "cli/tune.py"]
    assert unnamed_modules(page, modules) == []
    assert unnamed_modules(page, [*modules, "runtime/tensorflow/keras/stop.py", "cli/epochs.py"]) == [
        "cli/epochs.py",
        "runtime/stop.py",
        "runtime/tensorflow/keras/stop.py",
        "runtime/torch/stop.py",
    ]
    assert unnamed_modules(page, ["errors.py", "runtime/epoch_reader/epochs.py"]) == ["errors.py"]


# Wording that tells how the code or a figure came about instead of what the product does: numbered work
# periods, the tracker's issue and task numbers, what was so before a change. A pytest or boto3
# session, srun's "task 1: Exited ..." and "the previous epoch's FIFO" are not history, and none of
# these match them.
_ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth)"
HISTORY = [
    re.compile(rf"\b{_ORDINAL}\s+(?:work\s+)?(?:sessions?|work\s+periods?)\b", re.I),
    re.compile(r"\b(?:this|that|last|previous|earlier|other)\s+(?:work\s+)?sessions?\b(?!-scoped)", re.I),
    re.compile(r"\bissues?\s+#?\d+", re.I),
    re.compile(r"\btasks?\s+#?\d+\b(?!:)", re.I),
    re.compile(r"\b(?:before|after|since)\s+this\s+(?:change|session|issue|task)\b", re.I),
]


def _history_sources():
    yield ROOT / "README.md"
    yield from sorted(p for p in DOCS.rglob("*.md") if "notebooks" not in p.relative_to(DOCS).parts)
    for folder in ("sagemaker_dist", "tests", "bench"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_page_docstring_or_comment_tells_the_history_of_its_making():
    found = []
    for path in _history_sources():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(pattern.search(line) for pattern in HISTORY):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "history of the making (it belongs in git):\n" + "\n".join(found)
