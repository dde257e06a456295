"""What ``/bin/sh -c LINE`` hands a program as its arguments, modelled without running a shell.

sagemaker-training 4.8.3 (the TensorFlow DLCs' toolkit) joins the mpirun command with spaces and runs
it through ``/bin/sh``, so every hyperparameter value is re-parsed by the shell: split at blanks,
quotes removed, ``$VAR`` and ``~`` expanded, ``*`` globbed. This reproduces POSIX sh for that, and
raises ``ShellSyntaxError`` for what it cannot model or what would break the command (command
substitution, ``;``, ``|``, ``&``, redirections, an unterminated quote).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from collections.abc import Mapping

from sagemaker_dist.contract.environment import home, inherited
from sagemaker_dist.errors import ConfigurationError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = set(";&|<>()")
_GLOB = set("*?[")
_TILDE = re.compile(r"~([A-Za-z0-9._-]*)(?=/|[ \t\n]|$)")  # a tilde prefix sh expands


class ShellSyntaxError(ConfigurationError):
    """A command line whose effect is not a plain list of arguments (or that the shell refuses).

    A configuration error, so every command prints it as one ``error:`` line, not a traceback."""


class _Word:
    """One word being built: its text, and which characters may still glob (unquoted ones)."""

    def __init__(self):
        self.parts: list[tuple[str, bool]] = []  # (text, quoted)
        self.started = False  # a quoted empty string still makes a word

    def add(self, text: str, quoted: bool) -> None:
        self.parts.append((text, quoted))
        self.started = True

    def finish(self, cwd: str | None) -> list[str]:
        text = "".join(t for t, _ in self.parts)
        may_glob = any(not q and any(c in _GLOB for c in t) for t, q in self.parts)
        if may_glob and cwd is not None:
            matches = _pathname_expansion(_glob_pattern(self.parts), cwd)
            if matches:
                return matches
        return [text] if self.started else []


def _pathname_expansion(pattern: str, cwd: str) -> list[str]:
    """sh's globbing: a leading dot must be matched explicitly (and then '.' and '..' match too)."""
    if "/" in pattern:
        return sorted(glob.glob(pattern, root_dir=cwd))
    names = os.listdir(cwd) + [".", ".."]
    if not pattern.startswith("."):
        names = [n for n in names if not n.startswith(".")]
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def _glob_pattern(parts) -> str:
    return "".join(glob.escape(t) if quoted else t for t, quoted in parts)


def _expand(line: str, i: int, env: Mapping[str, str]) -> tuple[str, int]:
    """The value of the parameter at ``line[i] == '$'`` and the index after it."""
    nxt = line[i + 1 : i + 2]
    if nxt in ("(", "`") or line[i + 1 : i + 3] == "((":
        raise ShellSyntaxError("command substitution $(...) would run a command")
    if nxt == "{":
        end = line.find("}", i + 2)
        if end < 0:
            raise ShellSyntaxError("unterminated ${...}")
        name = line[i + 2 : end]
        if not _NAME.fullmatch(name):
            raise ShellSyntaxError(f"${{{name}}} is not a plain parameter expansion")
        return env.get(name, ""), end + 1
    match = _NAME.match(line, i + 1)
    if match and match.group() == "_":
        raise ShellSyntaxError("$_ is set by the shell itself (the last argument of its last command)")
    if match:
        return env.get(match.group(), ""), match.end()
    if nxt and (nxt.isdigit() or nxt in "$?#!@*-"):
        raise ShellSyntaxError(f"special parameter ${nxt} depends on the shell process")
    return "$", i + 1  # a lone $ stays


def _double_quoted(line: str, i: int, env: Mapping[str, str]) -> tuple[str, int]:
    """The text of a "..." string starting after its opening quote, and the index after the closing one."""
    out = []
    while i < len(line):
        c = line[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\" and line[i + 1 : i + 2] in ('"', "\\", "$", "`", "\n"):
            out.append(line[i + 1])
            i += 2
        elif c == "$":
            value, i = _expand(line, i, env)
            out.append(value)
        elif c == "`":
            raise ShellSyntaxError("command substitution `...` would run a command")
        else:
            out.append(c)
            i += 1
    raise ShellSyntaxError("unterminated double quote")


def shell_words(line: str, environ: Mapping[str, str] | None = None, cwd: str | None = None) -> list[str]:
    """The arguments ``sh -c line`` gives its command (``cwd``: where ``*`` globs; None: no globbing)."""
    env = inherited() if environ is None else environ
    words: list[str] = []
    word = _Word()
    i = 0
    in_token = False  # comments and tildes are recognised at the start of a token, before expansion
    while i < len(line):
        c = line[i]
        if c in " \t\n":
            words += word.finish(cwd)
            word, i, in_token = _Word(), i + 1, False
            continue
        starts_token, in_token = not in_token, True
        if c == "#" and starts_token:
            break  # a comment: the rest of the line is gone
        elif c == "\\":
            if i + 1 == len(line):
                word.add("\\", True)  # a backslash ending the line stays
            elif line[i + 1] != "\n":
                word.add(line[i + 1], True)
            i += 2
        elif c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise ShellSyntaxError("unterminated single quote")
            word.add(line[i + 1 : end], True)
            i = end + 1
        elif c == '"':
            text, i = _double_quoted(line, i + 1, env)
            word.add(text, True)
        elif c == "$":
            value, i = _expand(line, i, env)
            fields = value.split()
            if value[:1].isspace() and word.started:
                words += word.finish(cwd)
                word = _Word()
            for n, field in enumerate(fields):
                if n:
                    words += word.finish(cwd)
                    word = _Word()
                word.add(field, False)
            if value[-1:].isspace() and word.started:
                words += word.finish(cwd)
                word = _Word()
        elif c == "`":
            raise ShellSyntaxError("command substitution `...` would run a command")
        elif c in _OPERATORS:
            raise ShellSyntaxError(f"{c!r} is a shell operator: it would end or redirect the command")
        elif c == "~" and starts_token and _TILDE.match(line, i):
            user = _TILDE.match(line, i).group(1)
            if user:
                raise ShellSyntaxError(f"~{user} expands to that user's home directory")
            word.add(home(env), True)
            i += 1
        else:
            word.add(c, False)
            i += 1
    return words + word.finish(cwd)
