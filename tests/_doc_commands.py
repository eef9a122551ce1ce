"""The examples of the docs as a reader copies them: each fenced block's shell commands (continuation
lines joined, comments dropped, ``a; b`` and ``a && b`` taken one at a time), its Python, and the
files it names (a block whose first line is ``# NAME``). tests/test_doc_commands.py runs them;
tests/test_nemo_run.py runs the NeMo-Run ones.

A block right after ``<!-- not run here: WHY -->`` carries the page's own reason why no CPU machine
can run it (a batch script for a cluster, an executor for one)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/usage.md", "docs/cluster.md")

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_MARKER = re.compile(r"<!--\s*not run here:\s*(.+?)\s*-->\s*$", re.S)
_SHELL = ("", "bash", "sh", "shell", "console")
# what starts a shell command (after VAR=value words): a block none of whose lines starts so is a
# diagram or a listing, not commands
_COMMAND = re.compile(r"^(?:[A-Za-z_]\w*=\S*\s+)*(?:mimo-accel|python3?|torchrun|make|srun|sbatch|eval|export|"
                      r"tensorboard|pip|docker|git|\S*/bin/\S+)(?:\s|$)")


@dataclass(frozen=True)
class Example:
    page: str  # relative to the repository
    block: int  # the fenced block's place on its page (1-based)
    kind: str  # "shell", "python" or "file"
    text: str  # a shell command, a Python block, or a file's contents
    not_here: Optional[str] = None  # the page's marker: why no CPU machine runs it
    name: Optional[str] = None  # a file block's file name

    @property
    def id(self) -> str:
        return f"{self.page}#{self.block}: {self.text.splitlines()[0][:70]}"


def _split(line: str, on: tuple[str, ...]) -> list[str]:
    """``line`` cut at each separator of ``on`` outside quotes and ``$(...)``; a ``#`` that starts a
    word there starts a comment, which is dropped."""
    parts, start, quote, depth, i = [], 0, "", 0, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                i += 1
        elif c in "'\"":
            quote = c
        elif line.startswith("$(", i):
            depth += 1
            i += 1
        elif c == ")" and depth:
            depth -= 1
        elif depth == 0 and c == "#" and (i == 0 or line[i - 1].isspace()):
            line = line[:i]
            break
        elif depth == 0 and (sep := next((s for s in on if line.startswith(s, i)), None)):
            parts.append(line[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    parts.append(line[start:])
    return [p.strip() for p in parts if p.strip()]


def _blocks(text: str):
    """(language, body, the page's marker or None) of each fenced block."""
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        yield m.group(1), m.group(2), marker.group(1) if marker else None


def examples(page: str) -> list[Example]:
    out = []
    for number, (lang, body, not_here) in enumerate(_blocks((ROOT / page).read_text(encoding="utf-8")), 1):
        first = body.splitlines()[0] if body.strip() else ""
        if lang == "python":
            out.append(Example(page, number, "python", body, not_here))
        elif (name := re.fullmatch(r"#\s*(\S+\.\w+)\s*", first)) and lang not in _SHELL:
            out.append(Example(page, number, "file", body, not_here, name.group(1)))
        elif lang in _SHELL:
            lines = [ln.strip() for ln in body.replace("\\\n", " ").splitlines()]
            commands = [c for ln in lines for c in _split(ln, ("&&", ";"))]
            if any(_COMMAND.match(c) for c in commands):
                out += [Example(page, number, "shell", c, not_here) for c in commands]
    return out


def all_examples() -> list[Example]:
    return [e for page in PAGES for e in examples(page)]
