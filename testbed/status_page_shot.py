"""Headless Chromium on the agent's status page, and the README's picture of it (not run in CI).

    python -m testbed.status_page_shot --out docs/images/status-page.png

renders the `events` scene, starts a broker and the edge agent on it with the status page and a
stand-in snapshot recorder (so events carry thumbnails), waits until events have arrived, and has
headless Chromium (Debian package `chromium`) take the screenshot. The tests use
`chromium_screenshot` and `chromium_dom` on their own agent.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import cv2

from edge_agent.config import EdgeAgentConfig
from edge_agent.config.web import WebConfig
from edge_agent.pipeline import EdgeAgent
from edge_agent.web import attach_status_page
from testbed.alert_check import scene_agent_config
from testbed.broker import start_broker
from testbed.scenes.scenario import make_scenario
from testbed.scenes.writer import write_scene

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
EDGE_MODEL = REPO_ROOT / "models" / "edge" / "edge-yolov5n-320-int8.tflite"
CLASS_NAMES = ("person", "car", "truck", "forklift")
MEDIA_CACHE_DIR = REPO_ROOT / ".cache" / "media"
# no sandbox: it needs user namespaces, which containers and CI runners as root do not have;
# no proxy: the page is on loopback, whatever the environment's proxy settings say
_BASE_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-proxy-server",
    "--no-first-run",
)


class ChromiumError(RuntimeError):
    """Chromium is missing, failed, or wrote nothing; the message has its output tail."""


def chromium_executable() -> str | None:
    """The Chromium binary (Debian's `chromium`, or `chromium-browser`), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run_chromium(
    flags: Sequence[str], url: str, profile_dir: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    executable = chromium_executable()
    if executable is None:
        raise ChromiumError("chromium not found (apt-get install chromium)")
    argv = [executable, *_BASE_FLAGS, f"--user-data-dir={profile_dir}", *flags, url]
    try:
        done = subprocess.run(  # noqa: S603 (argv built here, no shell)
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ChromiumError(f"chromium did not finish in {timeout_s} s") from exc
    if done.returncode != 0:
        raise ChromiumError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def chromium_screenshot(
    url: str,
    out: Path,
    *,
    window_size: tuple[int, int] = (1280, 900),
    virtual_time_budget_ms: int = 3000,
    timeout_s: float = 60.0,
) -> Path:
    """A PNG of `url` after `virtual_time_budget_ms` of page time (the page's polls run)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        flags = [
            f"--screenshot={out}",
            f"--window-size={window_size[0]},{window_size[1]}",
            f"--virtual-time-budget={virtual_time_budget_ms}",
            "--hide-scrollbars",
        ]
        done = _run_chromium(flags, url, Path(profile), timeout_s)
    if not out.is_file() or out.stat().st_size == 0:
        raise ChromiumError(f"chromium wrote no screenshot: {done.stderr[-2000:]}")
    return out


def chromium_dom(url: str, *, virtual_time_budget_ms: int = 3000, timeout_s: float = 60.0) -> str:
    """The DOM of `url` as serialised after `virtual_time_budget_ms` of page time."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        flags = ["--dump-dom", f"--virtual-time-budget={virtual_time_budget_ms}"]
        return _run_chromium(flags, url, Path(profile), timeout_s).stdout


def take_screenshot(out: Path, work_dir: Path, *, camera: str, wait_events: int) -> Path:
    """Run the events scene with the status page until `wait_events` events arrived (or the
    clip ended), then screenshot the page to `out`."""
    scene = write_scene(make_scenario("events", 1), work_dir / "scene", MEDIA_CACHE_DIR)
    if scene.video is None:
        raise RuntimeError(f"the scene writer rendered no video in {scene.root}")
    broker = start_broker("auto", work_dir / "broker")
    try:
        document = scene_agent_config(
            scene.root,
            camera_url=str(scene.video),
            model_path=EDGE_MODEL,
            class_names=CLASS_NAMES,
            mqtt_port=broker.port,
            outbox_path=work_dir / "outbox.sqlite3",
            loop_file=True,
        )
        document["cameras"][0]["name"] = camera
        document["media"] = {
            "enabled": True,
            "directory": str(work_dir / "media"),
            "clips": {"enabled": True},
        }
        config = EdgeAgentConfig.model_validate(document)
        agent = EdgeAgent.from_config(config)
        if agent.media is None:
            raise RuntimeError("the media store is disabled")
        server = attach_status_page(
            agent, WebConfig(enabled=True, port=0), media_resolver=agent.media.resolve
        )
        if server is None:
            raise RuntimeError("the status page is disabled")
        stop = threading.Event()
        runner = threading.Thread(target=agent.run, args=(stop,), name="frame-loop")
        agent.start()
        runner.start()
        try:
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline:
                if len(server.view.recent_events()) >= wait_events:
                    break
                time.sleep(0.2)
            chromium_screenshot(server.url, out)
        finally:
            stop.set()
            runner.join(10)
            server.close()
            agent.close(flush_timeout_s=2.0)
    finally:
        broker.stop()
    return out


def save_media_examples(media: Path, out: Path) -> None:
    """Copy the snapshot and crop of the first event that has a clip, and the clip's middle
    frame, to `out` as `event-snapshot.jpg`, `event-crop.jpg`, `event-clip-frame.jpg`."""
    out.mkdir(parents=True, exist_ok=True)
    for clip in sorted(media.rglob("*_clip.*")):
        stem = clip.name.split("_clip.")[0]
        snapshot, crop = clip.with_name(f"{stem}.jpg"), clip.with_name(f"{stem}_crop.jpg")
        if not (snapshot.is_file() and crop.is_file()):
            continue
        capture = cv2.VideoCapture(str(clip))
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        capture.set(cv2.CAP_PROP_POS_FRAMES, max(0, count // 2))
        ok, frame = capture.read()
        capture.release()
        if not ok:
            continue
        shutil.copyfile(snapshot, out / "event-snapshot.jpg")
        shutil.copyfile(crop, out / "event-crop.jpg")
        cv2.imwrite(str(out / "event-clip-frame.jpg"), frame, [cv2.IMWRITE_JPEG_QUALITY, 85])
        logger.info("saved the media of %s to %s (clip of %d frames)", stem, out, count)
        return
    logger.warning("no event with a snapshot, a crop and a readable clip in %s", media)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write the screenshot; 1 when Chromium or the agent fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs/images/status-page.png")
    parser.add_argument("--camera", default="loading-dock", help="Camera name on the page.")
    parser.add_argument("--events", type=int, default=8, help="Wait for this many events.")
    parser.add_argument(
        "--media-out",
        type=Path,
        default=None,
        help="Also save one event's snapshot, crop and a clip frame here (for the README).",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="status-page-") as work:
        try:
            take_screenshot(args.out, Path(work), camera=args.camera, wait_events=args.events)
        except ChromiumError as exc:
            logger.error("%s", exc)
            return 1
        if args.media_out is not None:
            save_media_examples(Path(work) / "media", args.media_out)
    image = cv2.imread(str(args.out))
    logger.info("wrote %s (%s)", args.out, None if image is None else image.shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
