"""The documentation's cheap checks (scripts/docs.sh builds the site itself, with --strict): the API page
covers every public name and each resolves, the README stays a front page, relative links in the
README and the pages point at files that exist, and no page, docstring or comment tells the history of
its making (that is in git)."""

from __future__ import annotations

import importlib
import importlib.util
import re
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
