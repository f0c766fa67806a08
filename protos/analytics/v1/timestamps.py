"""POSIX seconds to and from the contract's `google.protobuf.Timestamp` fields (capture time,
deadline), for both ends of the wire."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

_NANOS_PER_SECOND = 1_000_000_000


def timestamp_from_seconds(seconds: float) -> Timestamp:
    """A `Timestamp` for a POSIX time in seconds (e.g. `time.time()`), to the nanosecond."""
    stamp = Timestamp()
    stamp.FromNanoseconds(round(seconds * _NANOS_PER_SECOND))
    return stamp


def timestamp_to_seconds(stamp: Timestamp) -> float:
    """POSIX seconds of a `Timestamp`."""
    return stamp.seconds + stamp.nanos / _NANOS_PER_SECOND
