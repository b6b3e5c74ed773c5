"""Events kept: SQLite (WAL, schema versioned by ``PRAGMA user_version`` with migrations), one writer thread off the
event loop, snapshots as JPEG files beside the database, retention by age and by bytes.

Everything a write does goes through one queue to one thread, which drains what is waiting into one transaction
(1,000 events a second cost one commit each tenth of a second, not a thousand). Reads open their own connection
in a worker thread: WAL lets them run beside the writer.

What goes wrong is said once, naming the file and what to do:
- a file that is not a database, or fails SQLite's quick check: moved aside to ``events.db.corrupt-TIME`` (never
  emptied), and a fresh store made;
- a database another process holds locked: ``EventStoreError`` at start (stop the other edge-app, or give this one
  another ``[events] path``);
- a full disk: snapshots stop first (below ``min_free_bytes`` free, or on ENOSPC), events after; ``status()`` and
  the metrics say which (``snapshots_paused``, ``events_paused``), and writing resumes when space is back.

An event left open by a run that did not stop cleanly (SIGKILL, a power cut) is closed at the next ``open()``: its
end is the last time the store heard of its camera (``seen``, written at most every ``SEEN_EVERY_S``), marked
``ended_by = "restart"``; ``ended_at_open`` lists them, for the listeners to be told.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import queue
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_app.events.detector import Event
from edge_app.events.query import Query, public, run_query
from edge_app.events.schema import DB_NAME, EventStoreError, close_left_open, connect_checked, locked

log = logging.getLogger(__name__)
# a write on the writer thread; what it returns (if anything) is told whether its transaction committed
Op = Callable[[sqlite3.Connection], "Callable[[bool], None] | None"]

SEEN_EVERY_S = 1.0  # how often a camera's "last heard of" time is written


class EventStore:
    def __init__(self, folder: Path, retention_days: float = 30.0, max_bytes: int = 2_000_000_000,
                 min_free_bytes: int = 200_000_000) -> None:
        self.folder = folder
        self.path = folder / DB_NAME
        self.snapshots = folder / "snapshots"
        self.retention_days = retention_days
        self.max_bytes = max_bytes
        self.min_free_bytes = min_free_bytes
        self.moved_aside: Path | None = None
        self.snapshots_paused: str | None = None  # why snapshots are not written now
        self.events_paused: str | None = None
        self.written = 0
        self.dropped = 0  # writes given up (disk full, store closed)
        self.ended_at_open: list[Event] = []  # events a run that did not stop cleanly left open, closed by open()
        self._seen: dict[str, float] = {}  # camera -> the last "heard of" time queued
        self._queue: queue.Queue[Op | threading.Event | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    # --- opening -------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Open (creating, migrating, or moving a damaged file aside) and start the writer."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.snapshots.mkdir(exist_ok=True)
        try:
            conn = connect_checked(self.path)
        except sqlite3.DatabaseError as exc:
            if locked(exc):
                raise EventStoreError(f"{self.path} is locked by another process (another edge-app?): stop it, or "
                                      "give this one another [events] path") from exc
            self._move_aside(exc)
            conn = connect_checked(self.path)
        self.ended_at_open = close_left_open(conn)
        self._thread = threading.Thread(target=self._write_loop, args=(conn,), name="event-store", daemon=True)
        self._thread.start()

    def _move_aside(self, exc: Exception) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{DB_NAME}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                src.rename(Path(str(aside) + suffix))
        self.moved_aside = aside
        log.error("events: %s is damaged (%s): moved it aside to %s and started a fresh store; its events are "
                  "still in that file (sqlite3 %s '.recover' may save them)", self.path, exc, aside.name, aside)

    # --- writing (one thread) ------------------------------------------------------------------------------

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        stop = False
        while not stop:
            ops = [self._queue.get()]
            while len(ops) < 5000:
                try:
                    ops.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in ops
            self._run(conn, [o for o in ops if o is not None and not isinstance(o, threading.Event)])
            for done in ops:  # a flush is done once what came before it is committed
                if isinstance(done, threading.Event):
                    done.set()
        conn.close()

    def _run(self, conn: sqlite3.Connection, ops: list[Op]) -> None:
        """``ops`` in one transaction; on failure (a full disk, a locked or damaged file) they are dropped and
        counted, and the store says why until a write succeeds again."""
        after: list[Callable[[bool], None]] = []  # what an op wants told once its change is committed (or not)
        try:
            conn.execute("BEGIN")
            for op in ops:
                told = op(conn)
                if told is not None:
                    after.append(told)
            conn.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for tell in after:
                tell(False)
            self.dropped += len(ops)
            reason = "the disk is full" if "full" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC \
                else str(exc)
            if self.events_paused != reason:
                log.error("events: cannot write to %s (%s): %d change(s) dropped; free space on that disk or move "
                          "[events] path", self.path, reason, len(ops))
            self.events_paused = reason
            return
        self.written += len(ops)
        for tell in after:
            tell(True)
        if self.events_paused:
            log.info("events: writing again to %s", self.path)
        self.events_paused = None

    def put(self, event: Event, model: str | None) -> None:
        """Insert or update ``event`` (its id, times, best confidence and how it ended)."""
        row = (event.id, event.source, event.label, event.start_s, event.end_s, event.best_confidence,
               event.best_at_s, model, event.ended_by)

        def op(c: sqlite3.Connection) -> None:
            c.execute('INSERT INTO events (id, source, label, start, "end", best_confidence, best_at, model, ended_by) '
                      'VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "end" = excluded."end", '
                      "best_confidence = excluded.best_confidence, best_at = excluded.best_at, "
                      "ended_by = excluded.ended_by", row)
        self._queue.put(op)
        self.seen(event.source, max(event.best_at_s, event.end_s or 0.0))

    def seen(self, source: str, t: float) -> None:
        """The camera was heard of at ``t`` (unix seconds); written at most every ``SEEN_EVERY_S`` per camera."""
        if t - self._seen.get(source, -1e18) < SEEN_EVERY_S:
            return
        self._seen[source] = t

        def op(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO sources (name, last_seen) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET "
                      "last_seen = max(last_seen, excluded.last_seen)", (source, t))
        self._queue.put(op)

    def put_snapshot(self, event_id: str, jpeg: bytes) -> None:
        """The event's best frame (replacing the one before), unless the disk is short of space."""
        def write(c: sqlite3.Connection) -> None:
            if not self._room_for_snapshot():
                return
            path = self.snapshot_path(event_id)
            try:
                path.write_bytes(jpeg)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                self._pause_snapshots("the disk is full (ENOSPC)")
                return
            c.execute("UPDATE events SET snapshot_bytes = ? WHERE id = ?", (len(jpeg), event_id))
        self._queue.put(write)

    def _room_for_snapshot(self) -> bool:
        free = shutil.disk_usage(self.folder).free
        if free < self.min_free_bytes:
            self._pause_snapshots(f"{free // 1_000_000} MB free, under min_free_bytes")
            return False
        if self.snapshots_paused:
            log.info("events: writing snapshots again (%d MB free)", free // 1_000_000)
        self.snapshots_paused = None
        return True

    def _pause_snapshots(self, reason: str) -> None:
        if self.snapshots_paused is None:
            log.error("events: snapshots paused, %s in %s; events are still kept. Free space there", reason,
                      self.snapshots)
        self.snapshots_paused = reason

    def snapshot_path(self, event_id: str) -> Path:
        return self.snapshots / f"{event_id}.jpg"

    def delete(self, event_id: str, done: Callable[[bool | None], None] | None = None) -> None:
        """``done(True)`` once it is deleted and committed, ``done(False)`` if there was none, ``done(None)`` if
        the store could not write."""
        def op(c: sqlite3.Connection) -> Callable[[bool], None]:
            gone = c.execute("DELETE FROM events WHERE id = ?", (event_id,)).rowcount > 0
            self.snapshot_path(event_id).unlink(missing_ok=True)
            return lambda ok: None if done is None else done(gone if ok else None)
        self._queue.put(op)

    def enforce_retention(self, now: float | None = None) -> None:
        """Events that ended more than ``retention_days`` ago go, and then the oldest until the store is under
        ``max_bytes`` (database and snapshots)."""
        now = time.time() if now is None else now

        def op(c: sqlite3.Connection) -> None:
            old = [r[0] for r in c.execute('SELECT id FROM events WHERE "end" IS NOT NULL AND "end" < ?',
                                           (now - self.retention_days * 86400,))]
            over = self.size_bytes(c) - self.max_bytes
            if over > 0:
                for event_id, snap in c.execute("SELECT id, snapshot_bytes FROM events ORDER BY start ASC"):
                    if over <= 0:
                        break
                    if event_id not in old:
                        old.append(event_id)
                    over -= snap + 200  # a row's share of the database, roughly
            for event_id in old:
                c.execute("DELETE FROM events WHERE id = ?", (event_id,))
                self.snapshot_path(event_id).unlink(missing_ok=True)
            if old:
                log.info("events: retention removed %d event(s)", len(old))
        self._queue.put(op)

    def size_bytes(self, conn: sqlite3.Connection | None = None) -> int:
        """What the store holds: the database's pages in use (deleted rows' pages are reused, not returned to the
        disk) and the snapshots."""
        c = conn or self._reader()
        try:
            pages, free, size = (c.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count",
                                                                                   "page_size"))
        finally:
            if conn is None:
                c.close()
        return int((pages - free) * size) + sum(p.stat().st_size for p in self.snapshots.glob("*.jpg"))

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every write queued so far is done (tests, shutdown)."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(10.0)
            self._thread = None

    # --- reading (any thread) ------------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=2.0)
        conn.row_factory = sqlite3.Row
        return conn

    def query(self, q: Query) -> dict[str, Any]:
        """A page of events, newest first (``edge_app.events.query``)."""
        with contextlib.closing(self._reader()) as conn:
            return run_query(conn, q)

    def get(self, event_id: str) -> dict[str, Any] | None:
        with contextlib.closing(self._reader()) as conn:
            row = conn.execute("SELECT * FROM events WHERE id = ?", (event_id,)).fetchone()
        return None if row is None else public(dict(row))

    def status(self) -> dict[str, Any]:
        return {"path": str(self.path), "written": self.written, "dropped": self.dropped,
                "queued": self._queue.qsize(), "snapshots_paused": self.snapshots_paused,
                "events_paused": self.events_paused,
                "moved_aside": None if self.moved_aside is None else str(self.moved_aside)}
