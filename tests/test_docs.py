"""The README and docs/ stay true to the code: every link resolves (files and section anchors), every
`mimo-accel` command names a real subcommand and real flags, every example-script flag exists,
every script and make target named is there. (The commands are not run here: the suite runs
them where they are tested — tests/test_tensorboard.py, test_pretrain_loop.py, ...)"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _code(page: Path) -> list[str]:
    """Every command-ish line of a page: fenced blocks (continuation lines joined) and inline code."""
    text = page.read_text(encoding="utf-8")
    lines: list[str] = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        lines += [ln.strip() for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
    lines += re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return s.replace(" ", "-")


def _anchors(page: Path) -> set:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)}


def test_there_are_pages():
    assert {p.name for p in PAGES} >= {"README.md", "usage.md", "design.md", "measurements.md",
                                       "compatibility.md", "peer-suite.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target} — no such file"
        if anchor:
            assert anchor in _anchors(dest), f"{page.name}: link to {target} — no such section in {dest.name}"


@lru_cache(maxsize=None)
def _help(*argv: str) -> str:
    proc = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"{' '.join(argv)} --help: {proc.stderr[-2000:]}"
    return proc.stdout


@lru_cache(maxsize=None)
def _example_help() -> str:
    """examples/train_mimo.py's --help, from the file's own parse_args loaded in this process
    (a fresh interpreter would spend seconds importing megatron again)."""
    import contextlib
    import io

    from tests._example import load_example

    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(SystemExit):
        load_example().parse_args(["--help"])
    return text.getvalue()


def _commands():
    for page in PAGES:
        for line in _code(page):
            for m in re.finditer(r"mimo-accel ([a-z][a-z-]*)([^|;\"')]*)", line):
                yield page.name, line, m.group(1), m.group(2)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_mimo_accel_command_names_real_flags(page):
    subcommands = set(re.search(r"\{([a-z,-]+)\}", _help("-m", "mimo_accel")).group(1).split(","))
    found = 0
    for name, line, sub, rest in _commands():
        if name != page.name:
            continue
        found += 1
        assert sub in subcommands, f"{name}: `{line}` — no subcommand {sub!r}"
        own, _, wrapped = rest.partition(" -- ")
        flags = set(FLAG.findall(_help("-m", "mimo_accel", sub)))
        for flag in FLAG.findall(own):
            assert flag in flags, f"{name}: `{line}` — mimo-accel {sub} has no {flag}"
        if "train_mimo.py" in wrapped:
            _check_example_flags(name, line, wrapped)
    assert found or page.name in ("peer-suite.md",)


def _check_example_flags(name: str, line: str, text: str) -> None:
    after = text.split("train_mimo.py", 1)[1]
    flags = set(FLAG.findall(_example_help()))
    for flag in FLAG.findall(after):
        assert flag in flags, f"{name}: `{line}` — examples/train_mimo.py has no {flag}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_script_flag_and_make_target_exists(page):
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    for line in _code(page):
        for script in re.findall(r"((?:benchmarks|upstream|examples)/[\w/]+\.py)", line):
            assert (ROOT / script).is_file(), f"{page.name}: `{line}` — no {script}"
            if script.startswith("upstream/") and "--" in line:
                flags = set(FLAG.findall(_help(script)))
                for flag in FLAG.findall(line.split(script, 1)[1]):
                    assert flag in flags, f"{page.name}: `{line}` — {script} has no {flag}"
        if "train_mimo.py" in line and "mimo-accel" not in line:
            _check_example_flags(page.name, line, line)
        for target in re.findall(r"(?<![\w-])make ([a-z][a-z-]*)", line):
            assert target in targets, f"{page.name}: `{line}` — no make target {target}"


def _literals() -> list[str]:
    """Every string literal of the package and the development kit, f-strings with each placeholder as a NUL."""
    import ast

    out = []
    for path in [*(ROOT / "mimo_accel").rglob("*.py"), *(ROOT / "mimo_accel_dev").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
            elif isinstance(node, ast.JoinedStr):
                out.append("".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values))
    return out


def test_every_troubleshooting_message_is_one_the_code_prints():
    page = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    messages = re.findall(r"^\*\*Message\*\*: `([^`]+)`", page, flags=re.M)
    assert len(messages) >= 20
    literals = _literals()
    for message in messages:
        assert any(message in text for text in literals), f"troubleshooting.md: no message of the code has {message!r}"
    # each entry says what it means and the fix
    for entry in re.split(r"^### ", page, flags=re.M)[1:]:
        assert "**Message**" in entry and "**Fix**" in entry, entry.splitlines()[0]


def test_the_readme_is_one_screen():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 60 and len(text.split()) <= 500
    for part in ("Install", "Quick start", "Is it on?", "Before / after", "Verified where"):
        assert re.search(rf"^#+ {re.escape(part)}", text, flags=re.M), part
    assert "make demo" in text and "make test" in text and "docs/troubleshooting.md" in text
