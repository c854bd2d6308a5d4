"""The README, docs/ and the results' READMEs as a reader meets them: every link resolves (to a file, a folder or a
heading), every repository path they name in backticks exists, the README's Python runs (or points to an example a
test runs), every number in the README's table links to its result, and benchmarks/results/ is indexed and holds
no scripts.  docs/archive/ is history, written against old paths, and is not checked."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ARCHIVE = ROOT / "docs" / "archive"


def tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def checked_pages() -> list[Path]:
    """The README, docs/ (not its archive) and every README under benchmarks/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").rglob("README.md"))]
    return [p for p in pages if ARCHIVE not in p.parents]


FENCE = re.compile(r"^(```|~~~)(\w*)[^\n]*\n(.*?)^\1\s*$", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE = re.compile(r"(`+)(.+?)\1", re.S)


def prose(text: str) -> str:
    """The text without its fenced code blocks (links and code spans inside them are not links)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def broken_links(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][\w+.-]*:", target):  # http(s), mailto: not followed
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif ROOT not in dest.parents and dest != ROOT:
            out.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return out


def top_level() -> set[str]:
    return {name.split("/", 1)[0] for name in tracked() if "/" in name}


PATHLIKE = re.compile(r"^[\w.][\w.\-/]*$")


def named_paths(page: Path) -> list[str]:
    """Repository paths a page names: words of inline code spans whose first part is a top-level folder of the
    repository (``casync/torch/hook.py``, ``tests/...::test_x``, ``benchmarks/results/whatif/``), and, in fenced
    blocks, such words that end in a file name with a suffix (a script run, a file read; not an output folder)."""
    tops = top_level()
    text = page.read_text()
    words = [(w, False) for span in CODE.findall(prose(text)) for w in span[1].split()]
    words += [(w, True) for block in FENCE.findall(text) for w in block[2].split()]
    out = []
    for word, fenced in words:
        word = word.split("::", 1)[0].strip("'\",;:()[]")
        if word.startswith("--") and "=" in word:
            word = word.split("=", 1)[1]
        if "/" not in word or not PATHLIKE.match(word) or "..." in word or word.split("/", 1)[0] not in tops:
            continue
        if fenced and not re.search(r"\.[a-z]{1,5}$", word):
            continue
        out.append(word)
    return out


@pytest.mark.parametrize("page", checked_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", checked_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(page):
    assert [p for p in named_paths(page) if not (ROOT / p.rstrip("/")).exists()] == []


def test_the_checks_catch_what_they_are_for(tmp_path):
    page = ROOT / "docs" / "_probe.md"  # inside the repository, so that its relative links resolve as a page's
    try:
        page.write_text("# A heading\n\n[ok](../README.md) [gone](nowhere.md) [bad anchor](#no-such) [good](#a-heading)"
                        "\n\n`casync/torch/hook.py` `casync/no_such.py` `tests/torch/test_hook.py::test_x` `out/x.py`\n\n"
                        "```bash\npython benchmarks/no_such.py --out benchmarks/results/new_folder\n```\n")
        assert broken_links(page) == ["nowhere.md: no such file", "#no-such: no heading #no-such in docs/_probe.md"]
        assert named_paths(page) == ["casync/torch/hook.py", "casync/no_such.py", "tests/torch/test_hook.py",
                                     "benchmarks/no_such.py"]
    finally:
        page.unlink()


# -- the README ----------------------------------------------------------------------------------------------------

README = (ROOT / "README.md").read_text()


def python_blocks(text: str) -> list[str]:
    return [m.group(3) for m in FENCE.finditer(text) if m.group(2) == "python"]


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 260


EXAMPLE = re.compile(r"examples/\w+\.py")


def test_the_readmes_python_blocks_run_or_point_to_an_example_a_test_runs(tmp_path):
    """A block that names an example (a DDP job needs torchrun, Ray Train a cluster) stands for it: that example
    must be one a test runs.  Every other block runs, in order, in one fresh interpreter in an empty directory."""
    runnable = []
    tests = {str(p): p.read_text() for p in (ROOT / "tests").rglob("test_*.py") if p.name != "test_docs.py"}
    for block in python_blocks(README):
        examples = EXAMPLE.findall(block)
        if not examples:
            runnable.append(block)
            continue
        for example in examples:
            assert (ROOT / example).exists(), example
            name = example.split("/")[1]
            assert any(f'"{name}"' in t or example in t for t in tests.values()), f"no test runs {example}"
    assert runnable, "the quickstart runs"
    script = tmp_path / "readme.py"
    script.write_text("\n".join(runnable))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]


def test_adding_a_codec_and_a_strategy_run_as_the_guide_shows(tmp_path):
    """docs/strategies-and-codecs.md's blocks (a codec, its profile, a strategy), in order, in one interpreter."""
    guide = (ROOT / "docs" / "strategies-and-codecs.md").read_text()
    blocks = python_blocks(guide)
    assert len(blocks) >= 3, "the codec, its profile and the strategy"
    script = tmp_path / "guide.py"
    script.write_text("\n".join(blocks))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]


def test_the_readmes_commands_are_the_two_commands():
    assert "pip install -e . && casync bench --quick --out out/" in README
    assert 'pip install -e ".[dev]" && python -m pytest -q -n auto' in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[dev]" && python -m pytest -q -n auto' in ci, "CI runs exactly the README's test command"


README_TABLES = ("## Where it stands", "## Does compression cost accuracy?")


@pytest.mark.parametrize("heading", README_TABLES)
def test_every_number_in_the_readmes_table_links_to_its_result(heading):
    """The README's tables (where casync stands; what compression costs in accuracy): every figure (a ratio,
    ``2.03×``) sits in a cell that links a result under benchmarks/results/, and is found in that result's reports
    (its README and bench.md files)."""
    section = _section(heading)
    rows = [line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")][1:]
    assert rows
    figures_seen = 0
    for row in rows:
        for cell in row.strip("|").split("|"):
            figures = re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?=×)", LINK.sub(lambda m: m.group(0).split("](")[0], cell))
            if not figures:
                continue
            links = [t for t in LINK.findall(cell) if "benchmarks/results/" in t]
            assert links, f"a figure without its result: {cell!r}"
            dest = ROOT / links[0].split("#")[0]
            folder = dest if dest.is_dir() else dest.parent
            evidence = "".join(p.read_text() for p in folder.rglob("*.md"))
            for figure in figures:
                assert figure in evidence, f"{figure} of {cell!r} is not in {folder.relative_to(ROOT)}"
            figures_seen += len(figures)
    assert figures_seen


def _section(heading: str) -> str:
    return README.split(heading, 1)[1].split("\n## ", 1)[0]


def test_the_readmes_figures_are_in_its_tables():
    """No ratio or time outside the README's tables (links excluded): a figure there would have no result beside it."""
    outside = prose(README)
    for heading in README_TABLES:
        outside = outside.replace(_section(heading), "")
    assert re.findall(r"\d(?:\.\d+)?\s?(?:×|ms\b)", LINK.sub("", outside)) == []


# -- benchmarks/results ----------------------------------------------------------------------------------------------

def test_results_hold_no_scripts():
    assert [f for f in tracked() if f.startswith("benchmarks/results/") and f.endswith((".py", ".sh"))] == []


def test_every_results_folder_is_indexed_and_has_a_readme():
    index = (RESULTS / "README.md").read_text()
    folders = sorted({f.split("/")[2] for f in tracked() if f.startswith("benchmarks/results/") and f.count("/") > 2})
    assert folders
    for folder in folders:
        assert f"]({folder}/" in index or f"]({folder})" in index, f"{folder} is not in the index"
        assert (RESULTS / folder / "README.md").exists(), folder
