"""Processes read from /proc: whether one still runs, and a process tree (what a stop must reach,
including helpers that called setsid and so left the process group a launcher would signal)."""

from __future__ import annotations

from pathlib import Path


def pid_running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(roots: list[int]) -> set[int]:
    """Every live descendant of ``roots``, from /proc (processes that called setsid included)."""
    children: dict[int, list[int]] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat_file.parent.name))
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
