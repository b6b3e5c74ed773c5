"""A page of events: filters, newest first, and an opaque cursor for the next page."""

from __future__ import annotations

import base64
import sqlite3
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Query:
    camera: str | None = None
    label: str | None = None
    after: float | None = None  # start at or after (unix seconds)
    before: float | None = None  # start before
    limit: int = 50
    cursor: str | None = None  # from the last page: the events after it


def encode_cursor(start: float, event_id: str) -> str:
    return base64.urlsafe_b64encode(f"{start!r}|{event_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        start, _, event_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        return float(start), event_id
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("cursor: not one this server gave (pass the 'next' of the last page)") from exc


def run_query(conn: sqlite3.Connection, q: Query) -> dict[str, Any]:
    where: list[str] = []
    args: list[Any] = []
    for clause, value in (("source = ?", q.camera), ("label = ?", q.label), ("start >= ?", q.after),
                          ("start < ?", q.before)):
        if value is not None:
            where.append(clause)
            args.append(value)
    if q.cursor is not None:
        start, event_id = decode_cursor(q.cursor)
        where.append("(start < ? OR (start = ? AND id < ?))")
        args += [start, start, event_id]
    sql = ("SELECT * FROM events" + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY start DESC, id DESC LIMIT ?")
    rows = [dict(r) for r in conn.execute(sql, [*args, q.limit + 1])]
    more = len(rows) > q.limit
    rows = rows[:q.limit]
    return {"events": [public(r) for r in rows],
            "next": encode_cursor(rows[-1]["start"], rows[-1]["id"]) if more else None}


def public(row: dict[str, Any]) -> dict[str, Any]:
    """An event as the API shows it."""
    return {"id": row["id"], "camera": row["source"], "label": row["label"], "start": row["start"],
            "end": row["end"], "best_confidence": round(row["best_confidence"], 3), "best_at": row["best_at"],
            "model": row["model"], "has_snapshot": row["snapshot_bytes"] > 0, "ended_by": row.get("ended_by")}


def merge_pages(pages: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """One page from the pages several stores gave for the same query and cursor (``serve --workers``): every store
    orders by (start, id), newest first, and a cursor is a place in that order, so the merged page's last event is
    the next page's cursor for all of them."""
    merged = sorted((e for p in pages for e in p["events"]), key=lambda e: (e["start"], e["id"]), reverse=True)
    more = len(merged) > limit or any(p.get("next") for p in pages)
    page = merged[:limit]
    return {"events": page, "next": encode_cursor(page[-1]["start"], page[-1]["id"]) if more and page else None}

