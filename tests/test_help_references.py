"""Every command the CLI names with a flag, in any help text or any message it can print (the string
literals of mimo_accel and the development kit), names a flag that command accepts: `mimo-accel X
--flag` (or `X --flag`) where X's parser has --flag; and a command's own help names only its own
flags (a shared parser's text says the flag of the command it serves). The parsers are the real ones,
taken from each command's main() as it starts parsing."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

from mimo_accel.tools import cli

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["doctor", "run", "env", *cli.DELEGATED]
NAMES = "|".join(re.escape(c) for c in sorted(COMMANDS, key=len, reverse=True))
# `mimo-accel X ...` up to where the sentence or the quote ends (its flags are X's, up to a job's `--`)
FULL = re.compile(rf"mimo-accel[ \n]({NAMES})(?![\w-])(?P<rest>[^;()`'\"\n,]*)")
BARE = re.compile(rf"(?<![\w./-])({NAMES}) (--[a-z][a-z0-9-]*)")  # `X --flag` in prose
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# a flag of another program: the command after a job's `--`, a script's (`examples/train_mimo.py
# --cpu`, "the example's --equal-work")
OTHER_PROGRAM = re.compile(r"\s--\s.*|[\w./-]+\.py(?: --?[\w-]+(?: [^\s;,()-][^\s;,()]*)?)+|the example's --[\w-]+")


class _Parser(Exception):
    pass


@pytest.fixture(scope="module")
def accepted(monkeypatch_module):
    """command -> every option string its parser takes (--help included)."""
    def grab(self, *args, **kwargs):
        raise _Parser(self)

    monkeypatch_module.setattr(argparse.ArgumentParser, "parse_args", grab)
    monkeypatch_module.setattr(argparse.ArgumentParser, "parse_intermixed_args", grab)
    found = {}
    for cmd in COMMANDS:
        with pytest.raises(_Parser) as got:
            cli.main([cmd, "--help"])
        found[cmd] = set(got.value.args[0]._option_string_actions)
    monkeypatch_module.undo()
    return found


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def helps(monkeypatch_module):
    """command -> its --help text, at a width where argparse wraps nothing."""
    monkeypatch_module.setenv("COLUMNS", "1000")
    texts = {}
    for cmd in COMMANDS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            assert cli.main([cmd, "--help"]) == 0
        texts[cmd] = out.getvalue()
        assert texts[cmd].startswith("usage: "), (cmd, texts[cmd][:200])
    monkeypatch_module.delenv("COLUMNS")
    return texts


def references(text: str):
    """(command, flag, where) for each flag the text gives a command."""
    for m in FULL.finditer(text):
        rest = re.split(r"\s--\s|\s--$|\.\s|\smimo-accel\s", m["rest"])[0]
        for flag in FLAG.findall(rest):
            yield m[1], flag, m.group(0)[:120]
    for m in BARE.finditer(text):
        yield m[1], m[2], text[max(0, m.start() - 40):m.end() + 40]


def literals(path: Path):
    """(line, text) of every string literal of a source file (an f-string's fields as {})."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def test_the_references_are_found():
    """The reader finds what the texts say (so an empty result below means something)."""
    found = set((c, f) for c, f, _ in references("e.g. mimo-accel layout --current SPEC --gpus 32; or simulate "
                                                 "--layout X, and mimo-accel run --features all -- torchrun --nnodes 2"))
    assert found == {("layout", "--current"), ("layout", "--gpus"), ("simulate", "--layout"), ("run", "--features")}


def test_every_flag_a_help_text_gives_a_command_is_one_it_takes(accepted, helps):
    assert set(accepted) == set(COMMANDS) and all("--help" in a for a in accepted.values())
    wrong = [(f"mimo-accel {where} --help", cmd, flag, context) for where, text in helps.items()
             for cmd, flag, context in references(text) if flag not in accepted[cmd]]
    assert wrong == []


def test_a_help_text_names_only_its_own_flags(accepted, helps):
    wrong = []
    for cmd, text in helps.items():
        own = OTHER_PROGRAM.sub(" ", BARE.sub(" ", FULL.sub(" ", text)))
        wrong += [(cmd, flag) for flag in sorted(set(FLAG.findall(own))) if flag not in accepted[cmd]]
    assert wrong == []


def test_every_flag_a_message_gives_a_command_is_one_it_takes(accepted):
    sources = sorted([*(ROOT / "mimo_accel").rglob("*.py"), *(ROOT / "mimo_accel_dev").rglob("*.py")])
    assert len(sources) > 100
    wrong = [(f"{path.relative_to(ROOT)}:{line}", cmd, flag, context) for path in sources
             for line, text in literals(path) for cmd, flag, context in references(text)
             if flag not in accepted[cmd]]
    assert wrong == []
