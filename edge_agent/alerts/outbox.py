"""`Outbox`: a disk-backed FIFO (SQLite, WAL) of MQTT messages waiting for the broker's ack.

Messages are appended with `put`, read oldest first with `peek` and deleted with `ack` once the
broker has acknowledged them, so they survive a broker outage and a restart of the process. The
outbox is bounded: beyond `max_rows` the oldest rows are dropped, and rows older than `max_age_s`
are dropped; `dropped` counts them (kept in the file, so it also survives restarts). A message
may carry its own expiry (`expires_s`, e.g. a retained status that is only true for a while):
past it, it is deleted unsent, since publishing it would state something no longer true.

Thread-safe: one connection guarded by a lock.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from edge_agent.config.mqtt import MqttConfig

__all__ = ["Outbox", "OutboxMessage"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    created_s REAL NOT NULL,
    expires_s REAL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (key, value) VALUES ('dropped', 0);
"""


@dataclass(frozen=True)
class OutboxMessage:
    """One queued message; `id` grows with insertion order."""

    id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    created_s: float
    expires_s: float | None = None  # wall-clock time past which the message is not sent


class Outbox:
    """A bounded, persistent FIFO of MQTT messages in one SQLite file."""

    def __init__(
        self,
        path: str | Path,
        *,
        max_rows: int = 100_000,
        max_age_s: float = 7 * 86_400,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Open (or create) the outbox at `path`; `clock` gives wall-clock seconds."""
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        if max_age_s <= 0:
            raise ValueError("max_age_s must be positive")
        self.path = Path(path)
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(outbox)")}
        if "expires_s" not in columns:  # a file written before messages could expire
            self._db.execute("ALTER TABLE outbox ADD COLUMN expires_s REAL")

    @classmethod
    def from_config(cls, config: MqttConfig) -> Self:
        """The outbox that `config` describes (`outbox_path`, `outbox_max_rows/age_s`)."""
        return cls(
            config.outbox_path,
            max_rows=config.outbox_max_rows,
            max_age_s=float(config.outbox_max_age_s),
        )

    def put(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        expires_s: float | None = None,
    ) -> int:
        """Append a message (deleted unsent past `expires_s`, wall clock) and enforce the
        bounds; returns its id."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            cursor = self._db.execute(
                "INSERT INTO outbox (topic, payload, qos, retain, created_s, expires_s)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (topic, payload, qos, int(retain), self._clock(), expires_s),
            )
            row_id = cursor.lastrowid
            self._enforce_bounds()
        if row_id is None:  # pragma: no cover - sqlite3 always sets it after an INSERT
            raise RuntimeError("SQLite gave no row id for the inserted message")
        return row_id

    def peek(self, n: int) -> list[OutboxMessage]:
        """The `n` oldest messages (after dropping expired ones), oldest first; none removed."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._enforce_bounds()
            rows = self._db.execute(
                "SELECT id, topic, payload, qos, retain, created_s, expires_s FROM outbox"
                " ORDER BY id LIMIT ?",
                (n,),
            ).fetchall()
        return [
            OutboxMessage(
                id=int(r[0]),
                topic=str(r[1]),
                payload=bytes(r[2]),
                qos=int(r[3]),
                retain=bool(r[4]),
                created_s=float(r[5]),
                expires_s=None if r[6] is None else float(r[6]),
            )
            for r in rows
        ]

    def ack(self, ids: Iterable[int]) -> int:
        """Delete the messages with these ids (unknown ids are ignored); returns how many."""
        id_list = [(int(i),) for i in ids]
        if not id_list:
            return 0
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            before = self._db.total_changes
            self._db.executemany("DELETE FROM outbox WHERE id = ?", id_list)
            return self._db.total_changes - before

    def depth(self) -> int:
        """Number of messages waiting."""
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        return int(count)

    @property
    def dropped(self) -> int:
        """Messages dropped by the bounds since the file was created."""
        with self._lock:
            (value,) = self._db.execute("SELECT value FROM meta WHERE key = 'dropped'").fetchone()
        return int(value)

    def close(self) -> None:
        """Close the database (messages stay in the file)."""
        with self._lock:
            self._db.close()

    def _enforce_bounds(self) -> None:
        """Drop expired rows and the oldest beyond `max_rows`; inside a transaction, locked."""
        now = self._clock()
        # past their own expiry: by design, not a loss, so not counted in `dropped`
        self._db.execute("DELETE FROM outbox WHERE expires_s IS NOT NULL AND expires_s < ?", (now,))
        cutoff = now - self.max_age_s
        dropped = self._db.execute("DELETE FROM outbox WHERE created_s < ?", (cutoff,)).rowcount
        (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        excess = int(count) - self.max_rows
        if excess > 0:
            dropped += self._db.execute(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT ?)",
                (excess,),
            ).rowcount
        if dropped > 0:
            self._db.execute("UPDATE meta SET value = value + ? WHERE key = 'dropped'", (dropped,))
