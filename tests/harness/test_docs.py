"""The docs' code blocks stay true: commands parse, named sessions and scripts exist, the examples load and run."""

from __future__ import annotations

import pkgutil
import re
import shlex

import pytest

from harness.cases.spec import load_case_file
from harness.cli.main import build_parser
from tests.fresh_python import ROOT, run_script
from tests.tiny_cases import write_cases

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(language: str) -> list[tuple[str, str]]:
    """(document name, block text) of every fenced block in `language`."""
    return [(doc.name, m.group(2)) for doc in DOCS for m in FENCE.finditer(doc.read_text()) if m.group(1) == language]


def command_lines() -> list[tuple[str, str]]:
    lines = []
    for doc, block in blocks("bash") + blocks(""):
        for line in block.splitlines():
            line = line.split("  #")[0].split(" # ")[0].strip()
            if line.startswith(("harness ", "nox ", "python scripts/", "bash scripts/", "pytest ")):
                lines.append((doc, line))
    return lines


@pytest.mark.parametrize(("doc", "line"), command_lines(), ids=lambda v: v if len(v) < 60 else v[:60])
def test_documented_command_exists(doc, line):
    words = shlex.split(line.replace("$I", "0").replace("$(", "").replace(")", ""))
    if words[0] == "harness":
        try:
            build_parser().parse_args(words[1:])
        except SystemExit as stop:
            pytest.fail(f"{doc}: `{line}` does not parse (exit {stop.code})")
    elif words[0] == "nox":
        session = words[words.index("-s") + 1]
        sessions = re.findall(r"^def (\w+)\(session", (ROOT / "noxfile.py").read_text(), re.M)
        assert session in sessions, f"{doc}: `{line}` names no nox session {session!r}"
    elif words[0] in ("python", "bash"):
        assert (ROOT / words[1]).is_file(), f"{doc}: `{line}` names a missing script"
    elif words[0] == "pytest":
        paths = [w for w in words[1:] if w.startswith(("tests", "benchmarks"))]
        assert all((ROOT / p).exists() for p in paths), f"{doc}: `{line}` names a missing test path"


def test_documented_case_files_load(tmp_path):
    toml_blocks = blocks("toml")
    assert toml_blocks, "the README shows the case format"
    for i, (doc, block) in enumerate(toml_blocks):
        path = tmp_path / f"{i}.toml"
        path.write_text(block)
        assert load_case_file(path), f"{doc}: the case-file example loads no case"


@pytest.mark.slow  # a harness run in a fresh interpreter
def test_readme_plugin_example_runs_through_the_cli(tmp_path):
    (doc, plugin), *_ = [b for b in blocks("python") if "register_backend" in b[1]]
    name = re.search(r'register_backend\(\s*"(\w+)"', plugin).group(1)
    (tmp_path / "my_kernel.py").write_text(plugin)
    write_cases(tmp_path / "tiny.toml", {"name": "tiny", "block_size": 8})  # the example takes multiples of 8
    done = run_script("-m", "harness", "run", str(tmp_path / "tiny.toml"), "--plugin", str(tmp_path / "my_kernel.py"),
                      "--backend", name, "--no-timing", "--no-progress", "--out", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 0, f"{doc}'s plugin example failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def test_docs_link_only_inside_the_repository():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#]+)", doc.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            resolved = (doc.parent / target).resolve()
            assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{doc.name}: link to {target}"
        assert "../" not in doc.read_text().replace("](../", ""), f"{doc.name} points outside the repository"


def test_every_dotted_harness_name_in_the_docs_exists():
    """A module or function moved without its docs fails here."""
    named = {m for doc in DOCS for m in re.findall(r"\bharness(?:\.[A-Za-z_]\w*)+", doc.read_text())}
    assert len(named) > 10
    missing = []
    for name in sorted(named):
        try:
            pkgutil.resolve_name(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing
