"""The event outbox: every event is written here (SQLite, in the state dir) before it is
sent, and stays until the server acks its id. On every (re)connect the agent resends
what is still here, oldest first. It survives agent restarts and reboots."""

import json
import sqlite3


class Outbox:
    def __init__(self, path):
        # isolation_level=None: each statement commits on its own, so an event is on
        # disk when add() returns.
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS events ("
            " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
            " id TEXT NOT NULL UNIQUE,"
            " frame TEXT NOT NULL)"
        )

    def add(self, frame):
        """Store an event frame (a dict with an `id`). Adding the same id twice keeps one."""
        self._db.execute(
            "INSERT OR IGNORE INTO events (id, frame) VALUES (?, ?)",
            (frame["id"], json.dumps(frame)),
        )

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
                cursor = self._db.execute("DELETE FROM events WHERE id = ?", (event_id,))
                removed += cursor.rowcount
        except BaseException:
            self._db.execute("ROLLBACK")
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
