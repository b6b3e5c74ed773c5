"""The events database as a file: its schema and migrations (``PRAGMA user_version``), the checks at open (damage,
a lock held by another process, a newer schema) and what a run that did not stop cleanly left open."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from edge_app.errors import EdgeAppError
from edge_app.events.detector import Event

log = logging.getLogger(__name__)

DB_NAME = "events.db"
MIGRATIONS = (  # version k+1 is MIGRATIONS[k]; a database at an older version is brought forward at open
    """CREATE TABLE events (id TEXT PRIMARY KEY, source TEXT NOT NULL, label TEXT NOT NULL, start REAL NOT NULL,
       "end" REAL, best_confidence REAL NOT NULL, best_at REAL NOT NULL, model TEXT, snapshot_bytes INTEGER NOT NULL
       DEFAULT 0);
       CREATE INDEX events_start ON events (start DESC, id DESC);
       CREATE INDEX events_source ON events (source, start DESC);
       CREATE INDEX events_label ON events (label, start DESC);""",
    # how an event ended (NULL: another state held), and when the store last heard of each camera: an event left
    # open by a crash ends there at the next start
    """ALTER TABLE events ADD COLUMN ended_by TEXT;
       CREATE TABLE sources (name TEXT PRIMARY KEY, last_seen REAL NOT NULL);""",
)
COLUMNS = ("id", "source", "label", "start", "end", "best_confidence", "best_at", "model", "snapshot_bytes",
           "ended_by")


class EventStoreError(EdgeAppError):
    """The store cannot be used; the message names the file and what to do."""


def connect_checked(path: Path) -> sqlite3.Connection:
    """A write connection to ``path``, checked (quick check, the write lock, the schema) and migrated forward; raises
    ``sqlite3.DatabaseError`` for a damaged file, ``EventStoreError`` for one from a newer edge-app."""
    conn = sqlite3.connect(path, check_same_thread=False, timeout=2.0, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise sqlite3.DatabaseError("quick_check failed")
        conn.execute("BEGIN IMMEDIATE")  # a write lock, at once: another process holding it is said now
        conn.execute("COMMIT")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > len(MIGRATIONS):
            raise EventStoreError(f"{path} was written by a newer edge-app (schema {version}, this one "
                                  f"knows {len(MIGRATIONS)}): upgrade, or give this one another [events] path")
        for k in range(version, len(MIGRATIONS)):
            conn.executescript(f"BEGIN; {MIGRATIONS[k]} PRAGMA user_version = {k + 1}; COMMIT;")
    except Exception:
        conn.close()
        raise
    return conn


def close_left_open(conn: sqlite3.Connection) -> list[Event]:
    """Every event still open (a run that did not stop cleanly) ends at the last time its camera was heard of (never
    before its start or its best answer), ``ended_by = "restart"``."""
    rows = conn.execute('SELECT e.id, e.source, e.label, e.start, e.best_confidence, e.best_at, s.last_seen FROM '
                        'events e LEFT JOIN sources s ON s.name = e.source WHERE e."end" IS NULL').fetchall()
    ended = [Event(source, label, start, conf, best_at, end_s=max(start, best_at, seen or 0.0), id=event_id,
                   ended_by="restart") for event_id, source, label, start, conf, best_at, seen in rows]
    if ended:
        conn.execute("BEGIN")
        conn.executemany('UPDATE events SET "end" = ?, ended_by = ? WHERE id = ?',
                         [(e.end_s, e.ended_by, e.id) for e in ended])
        conn.execute("COMMIT")
        log.warning("events: %d event(s) left open by the last run (it did not stop cleanly) ended at the last time "
                    "their camera was heard of: %s", len(ended), ", ".join(e.id for e in ended[:5]))
    return ended


def locked(exc: Exception) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)
