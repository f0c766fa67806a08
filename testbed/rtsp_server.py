"""A real RTSP server for tests: serves an H.264 MP4 clip in an endless loop.

Run it with the system interpreter, which has python3-gi (the project virtualenv does not):

    /usr/bin/python3 testbed/rtsp_server.py --port 8554 --mount stream --clip bikes.mp4

It prints one line `READY rtsp://HOST:PORT/MOUNT` on stdout once it listens, and exits 0 on
SIGTERM or SIGINT after closing its client sessions. `--check` only verifies that python3-gi,
the GStreamer RTSP server library and the needed elements are present (exit 0, else 3).

How the loop works: the clip's encoded access units are read once into memory (`qtdemux !
h264parse ! appsink`); each media pipeline is `appsrc ! clocksync ! h264parse ! rtph264pay` and
the appsrc is fed those same units again and again with timestamps that keep increasing. Nothing
is re-encoded (cheap on a 2-core machine), the loop is seamless because the clip starts with a
keyframe, and the factory is shared so any number of clients watch one pipeline. `clocksync`
paces the pushes to real time.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_MISSING_DEPENDENCY = 3
EXIT_STARTUP_FAILED = 4
REQUIRED_ELEMENTS = ("filesrc", "qtdemux", "h264parse", "appsink", "appsrc", "clocksync")
REQUIRED_ELEMENTS_RTP = ("rtph264pay",)
_PULL_POLL_NS = 100_000_000
_APT_HINT = (
    "apt-get install python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base "
    "gstreamer1.0-plugins-good gstreamer1.0-plugins-bad"
)

try:
    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import GLib, Gst, GstRtspServer
except (ImportError, ValueError) as _exc:
    sys.stderr.write(f"MISSING: python3-gi or the GStreamer RTSP server ({_exc}); {_APT_HINT}\n")
    sys.exit(EXIT_MISSING_DEPENDENCY)

logger = logging.getLogger("testbed.rtsp_server")


@dataclass(frozen=True)
class LoadedClip:
    """The encoded access units of one clip, in decode order, ready to be pushed again."""

    caps: Any  # Gst.Caps of the stream (avc, with codec_data)
    buffers: tuple[Any, ...]  # Gst.Buffer per access unit
    frame_duration_ns: int

    @property
    def duration_ns(self) -> int:
        """Length of one pass through the clip."""
        return self.frame_duration_ns * len(self.buffers)


def missing_elements() -> list[str]:
    """Names of the GStreamer elements this server needs that are not installed."""
    return [
        name
        for name in REQUIRED_ELEMENTS + REQUIRED_ELEMENTS_RTP
        if Gst.ElementFactory.find(name) is None
    ]


def load_clip(clip: Path, *, load_timeout_s: float = 30.0) -> LoadedClip:
    """Demux `clip` (an MP4 with one H.264 stream without B-frames) into memory."""
    pipeline = Gst.parse_launch(
        "filesrc name=file ! qtdemux ! h264parse "
        "! video/x-h264,stream-format=avc,alignment=au "
        "! appsink name=sink sync=false"
    )
    pipeline.get_by_name("file").set_property("location", str(clip))
    sink = pipeline.get_by_name("sink")
    pipeline.set_state(Gst.State.PLAYING)
    buffers: list[Any] = []
    caps: Any = None
    deadline = time.monotonic() + load_timeout_s
    try:
        while not sink.get_property("eos"):
            message = pipeline.get_bus().pop_filtered(Gst.MessageType.ERROR)
            if message is not None:
                error, debug = message.parse_error()
                raise RuntimeError(f"cannot read {clip}: {error.message} ({debug})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {clip} took more than {load_timeout_s} s")
            sample = sink.emit("try-pull-sample", _PULL_POLL_NS)
            if sample is not None:
                caps = caps or sample.get_caps()
                buffers.append(sample.get_buffer().copy())
    finally:
        pipeline.set_state(Gst.State.NULL)
    if not buffers or caps is None:
        raise RuntimeError(f"{clip} has no H.264 video frames")
    ok, num, den = caps.get_structure(0).get_fraction("framerate")
    if not ok or num <= 0 or den <= 0:
        raise RuntimeError(f"{clip}: no usable frame rate in caps {caps.to_string()}")
    return LoadedClip(caps=caps, buffers=tuple(buffers), frame_duration_ns=Gst.SECOND * den // num)


class ClipFeeder:
    """Feeds one media pipeline's appsrc with the clip's access units, forever.

    Timestamps start at the pipeline's running time when the first frame is asked for and grow
    by one frame duration per unit, across loop passes, so downstream sees one endless stream.

    The first unit is sent twice. The server consumes a new pipeline's first buffer while it
    prepares the media, before the client that asked for it has sent PLAY; without the priming
    copy that client would miss the clip's first keyframe and wait a whole GOP for the next one.
    """

    def __init__(self, clip: LoadedClip) -> None:
        self._clip = clip
        # -1: the priming copy of the first keyframe (see the class docstring).
        self._next_index = -1
        self._start_ns: int | None = None

    def on_need_data(self, appsrc: Any, _length: int) -> None:
        """appsrc `need-data` handler: push the next access unit (streaming thread)."""
        if self._start_ns is None:
            clock = appsrc.get_clock()
            self._start_ns = 0 if clock is None else clock.get_time() - appsrc.get_base_time()
        count = len(self._clip.buffers)
        buffer = self._clip.buffers[max(self._next_index, 0) % count].copy()
        pts = self._start_ns + (self._next_index + 1) * self._clip.frame_duration_ns
        buffer.pts = pts
        buffer.dts = pts
        buffer.duration = self._clip.frame_duration_ns
        self._next_index += 1
        if self._next_index % count == 0:
            logger.debug("clip loop %d done", self._next_index // count)
        result = appsrc.emit("push-buffer", buffer)
        if result != Gst.FlowReturn.OK:
            logger.debug("push-buffer returned %s", result)


def make_factory(clip: LoadedClip) -> Any:
    """A shared media factory whose pipelines play `clip` in a loop."""
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(
        "( appsrc name=src is-live=true format=time do-timestamp=false "
        "! clocksync sync=true "
        "! h264parse "
        "! rtph264pay name=pay0 pt=96 config-interval=-1 )"
    )
    factory.set_shared(True)

    def on_media_configure(_factory: Any, media: Any) -> None:
        appsrc = media.get_element().get_by_name("src")
        appsrc.set_property("caps", clip.caps)
        appsrc.connect("need-data", ClipFeeder(clip).on_need_data)
        logger.info("new media pipeline for %s", media)

    factory.connect("media-configure", on_media_configure)
    return factory


def _close_all_clients(server: Any) -> None:
    def remove(_server: Any, _client: Any) -> Any:
        return GstRtspServer.RTSPFilterResult.REMOVE

    server.client_filter(remove)


def serve(host: str, port: int, mount: str, clip_path: Path) -> int:
    """Serve `clip_path` at rtsp://host:port/mount until SIGTERM/SIGINT; return the exit code."""
    clip = load_clip(clip_path)
    logger.info(
        "loaded %s: %d frames, %.2f s per loop",
        clip_path,
        len(clip.buffers),
        clip.duration_ns / Gst.SECOND,
    )
    server = GstRtspServer.RTSPServer()
    server.set_address(host)
    server.set_service(str(port))
    server.get_mount_points().add_factory(f"/{mount}", make_factory(clip))
    server.connect(
        "client-connected", lambda _server, client: logger.info("client connected: %s", client)
    )
    source_id = server.attach(None)
    if source_id == 0:
        logger.error("cannot listen on %s:%d (port in use?)", host, port)
        return EXIT_STARTUP_FAILED
    loop = GLib.MainLoop()

    def on_signal(signum: int) -> bool:
        logger.info("signal %d: shutting down", signum)
        loop.quit()
        return GLib.SOURCE_REMOVE  # type: ignore[no-any-return]

    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signum, on_signal, signum)
    # The one line on stdout: the fixture waits for it.
    print(f"READY rtsp://{host}:{port}/{mount}", flush=True)  # noqa: T201
    loop.run()
    _close_all_clients(server)
    GLib.Source.remove(source_id)
    return EXIT_OK


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="verify dependencies and exit")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8554, help="TCP port to listen on")
    parser.add_argument("--mount", default="stream", help="path of the stream, without '/'")
    parser.add_argument("--clip", type=Path, help="H.264 MP4 to serve (no B-frames)")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    if not args.check and args.clip is None:
        parser.error("--clip is required")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point."""
    args = _parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    Gst.init(None)
    missing = missing_elements()
    if missing:
        sys.stderr.write(f"MISSING: GStreamer elements {', '.join(missing)}; {_APT_HINT}\n")
        return EXIT_MISSING_DEPENDENCY
    if args.check:
        return EXIT_OK
    if not args.clip.is_file():
        logger.error("clip %s does not exist", args.clip)
        return EXIT_STARTUP_FAILED
    try:
        return serve(args.host, args.port, args.mount.strip("/"), args.clip)
    except RuntimeError:
        logger.exception("cannot start the RTSP server")
        return EXIT_STARTUP_FAILED


if __name__ == "__main__":
    sys.exit(main())
