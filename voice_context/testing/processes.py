"""What the kernel says about processes, for the tests and ``scripts/load``: a supervisor's
workers (``serve --workers``) are its children."""

from __future__ import annotations

from pathlib import Path


def children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` now (Linux: read from ``/proc``)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
        if ppid == parent:
            found.append(int(stat.parent.name))
    return found
