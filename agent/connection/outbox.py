"""The event outbox: every event is written here (SQLite, in the state dir) before it is
sent, and stays until the server acks its id. On every (re)connect the agent resends
what is still here, oldest first. It survives agent restarts and reboots.

It is bounded on disk (`max_bytes` of event frames, outbox_max_mb in the agent's config): a
node cut off from the server for days, or a detector gone wrong, must not fill the disk.
To make room for a new event the oldest `info` events go first, then the oldest of any
severity. What was dropped is counted, and the next hello tells the server
(`outbox_dropped`); the count starts again once a welcome answered it."""

import json
import sqlite3

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class Outbox:
    def __init__(self, path, max_bytes=DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        # isolation_level=None: each statement commits on its own, so an event is on
        # disk when add() returns.
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS events ("
            " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
            " id TEXT NOT NULL UNIQUE,"
            " frame TEXT NOT NULL)"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(events)")}
        if "severity" not in columns:  # an outbox written by an agent before the bound
            self._db.execute("ALTER TABLE events ADD COLUMN severity TEXT NOT NULL DEFAULT ''")
        self._db.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY,"
                         " value INTEGER NOT NULL)")
        self._bytes = self._db.execute(
            "SELECT COALESCE(SUM(LENGTH(frame)), 0) FROM events").fetchone()[0]

    def add(self, frame):
        """Store an event frame (a dict with an `id`). Adding the same id twice keeps one.
        Returns how many older events were dropped to make room."""
        text = json.dumps(frame)
        if self._db.execute("SELECT 1 FROM events WHERE id = ?", (frame["id"],)).fetchone():
            return 0
        dropped = 0
        self._db.execute("BEGIN")
        try:
            while self._bytes + len(text) > self.max_bytes:
                oldest = self._db.execute(
                    "SELECT seq, LENGTH(frame) FROM events"
                    " ORDER BY severity = 'info' DESC, seq LIMIT 1").fetchone()
                if oldest is None:
                    break  # larger than the whole bound on its own: kept all the same
                self._db.execute("DELETE FROM events WHERE seq = ?", (oldest[0],))
                self._bytes -= oldest[1]
                dropped += 1
            self._db.execute("INSERT INTO events (id, frame, severity) VALUES (?, ?, ?)",
                             (frame["id"], text, frame.get("severity") or ""))
            if dropped:
                self._db.execute(
                    "INSERT INTO counters VALUES ('dropped', ?) ON CONFLICT (name)"
                    " DO UPDATE SET value = value + excluded.value", (dropped,))
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        self._bytes += len(text)
        return dropped

    def dropped(self):
        """Events dropped to make room since the server was last told."""
        row = self._db.execute("SELECT value FROM counters WHERE name = 'dropped'").fetchone()
        return row[0] if row else 0

    def told(self, count):
        """The server's welcome answered a hello that said `count` were dropped."""
        self._db.execute("UPDATE counters SET value = MAX(value - ?, 0) WHERE name = 'dropped'",
                         (count,))

    def pending(self):
        """Every event not yet acked, oldest first."""
        rows = self._db.execute("SELECT frame FROM events ORDER BY seq").fetchall()
        return [json.loads(frame) for (frame,) in rows]

    def remove(self, ids):
        """Forget these events (acked by the server, or refused by it for good).
        Returns how many were here."""
        removed = 0
        self._db.execute("BEGIN")  # one commit for the whole ack
        try:
            for event_id in ids:
                row = self._db.execute("SELECT LENGTH(frame) FROM events WHERE id = ?",
                                       (event_id,)).fetchone()
                if row is None:
                    continue
                self._db.execute("DELETE FROM events WHERE id = ?", (event_id,))
                removed += 1
                self._bytes -= row[0]
        except BaseException:
            self._db.execute("ROLLBACK")
            self._bytes = self._db.execute(
                "SELECT COALESCE(SUM(LENGTH(frame)), 0) FROM events").fetchone()[0]
            raise
        self._db.execute("COMMIT")
        return removed

    def get(self, event_id):
        row = self._db.execute("SELECT frame FROM events WHERE id = ?", (event_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def __len__(self):
        return self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0]

    def close(self):
        self._db.close()
