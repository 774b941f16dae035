"""Rendering for humans: tables, bars, durations, colour (as `cli.output.use_colour` says)."""

from __future__ import annotations

COLOURS = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "dim": "2", "bold": "1"}


def paint(text: str, colour: str, enabled: bool) -> str:
    return f"\x1b[{COLOURS[colour]}m{text}\x1b[0m" if enabled and colour else text


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        hours, minutes = divmod(seconds // 60, 60)
        return f"{hours}h{minutes}m" if minutes and hours < 10 else f"{hours}h"
    return f"{seconds // 86400}d"


def idle_text(idle_s: float, idle_state: str) -> str:
    """`-` when unknown, `12m` when exact, `≥1h` when only a lower bound is known."""
    if idle_state == "unknown" or idle_s < 0:
        return "-"
    return ("≥" if idle_state == "at_least" else "") + duration(idle_s)


def bar(used: int, total: int, width: int = 20, colour: bool = False) -> str:
    if total <= 0:
        return "[" + " " * width + "]"
    filled = round(width * used / total)
    share = used / total
    tint = "red" if share >= 0.9 else "yellow" if share >= 0.7 else "green"
    return "[" + paint("█" * filled, tint, colour) + "·" * (width - filled) + "]"


def table(
    headers: list[str],
    rows: list[list],
    no_headers: bool = False,
    right: set[int] | None = None,
    width: int = 0,
    gap: int = 3,
) -> str:
    """Columns aligned, `gap` spaces apart; with `width`, the last column (a reason, free
    text) is cut to fit."""
    right = right or set()
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    if width and cells:
        room = width - sum(widths[:-1]) - gap * (len(widths) - 1)
        if room < widths[-1]:
            room = max(room, len(headers[-1]), 20)
            for row in cells:
                row[-1] = truncate(row[-1], room)
            widths[-1] = room
    lines = []
    if not no_headers:
        lines.append(_line(headers, widths, right, gap))
    lines += [_line(row, widths, right, gap) for row in cells]
    return "\n".join(lines)


def _line(cells, widths, right, gap: int = 3) -> str:
    parts = [
        c.rjust(w) if i in right else c.ljust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=False))
    ]
    return (" " * gap).join(parts).rstrip()


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
