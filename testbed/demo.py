"""The README's main job: the hybrid edge-cloud pipeline end to end, on loopback, nothing external.

    python -m testbed.demo [--source synthetic|real] [--loops 1 | --duration-s S] [--out DIR]
                           [--mqtt-host H --mqtt-port P]

`--source synthetic` (the default):

1. renders the scripted `events` scene (a zone, a line, people and vehicles entering, leaving,
   crossing and loitering over real background video) with its ground truth and expected events;
2. starts the cloud service (gRPC, the committed cloud model on ONNX Runtime CPU) on a free port,
   as a process of its own with a CPU share of its own (`testbed.demo_stack`: a cgroup of
   `--cloud-cpus` cores where the machine allows one), so it cannot starve the edge;
3. serves the scene as a camera over RTSP (GStreamer, system python3-gi) where available, else
   lets the agent read the file paced at its frame rate;
4. starts an MQTT broker (Mosquitto where installed, else the embedded amqtt) unless
   `--mqtt-host` names one, and subscribes to the agent's topics;
5. runs the edge agent in-process (committed INT8 edge model, tracker, rules, MQTT alerts, hard
   frames escalated to the cloud and its answers fused into the tracks) for one scene loop;
6. prints progress and every alert as it arrives from the broker, then a summary (frames, whether
   and by how much the edge is behind the camera, share escalated, bytes sent, fusion, latency
   percentiles, alerts, the check against the scripted events, detection accuracy against the
   ground truth) and writes an annotated video.

`--source real` runs the same hybrid on real footage (`testbed.demo_real`): OpenCV's `vtest`
clip (people walking across a campus path) served over RTSP, the committed COCO-80 models (INT8
on the edge, FP32 in the cloud) and the zone, line and rules of `configs/demo-real.edge.yaml`.
There is no scripted ground truth: the summary reports the alerts raised, by rule, kind and
class, and the video goes to `.cache/demo-real/annotated.mp4`.

Exit status: 0 when everything ran (and, synthetic, the alerts matched the script); 1 when a check
failed (no frames, no cloud answers, alerts not as scripted, video not written); 2 when a
component did not start. Needs only the `edge` and `cloud` extras (no torch) and ffmpeg.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from detection.coco_eval import compute_metrics
from edge_agent.pipeline import EdgeAgent
from testbed.alert_check import EventMatch, load_expected, match_first_loop, observed_from_payloads
from testbed.demo_real import start_real_stack, summarise_real
from testbed.demo_report import (
    AlertFeed,
    Report,
    RunRecorder,
    SummaryTable,
    add_cloud_rows,
    ground_truth,
    latency_text,
    pace_of,
    video_lines,
)
from testbed.demo_stack import CACHE, DemoError, Printer, Stack, start_stack

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_START_FAILED = 2
EXIT_INTERRUPTED = 130
FIRST_FRAME_TIMEOUT_S = 30.0
TAIL_S = 1.5  # run on after the last loop so its last alerts arrive
TOLERANCE_S = 1.0  # an alert matches a scripted event this close in time
DRAIN_TIMEOUT_S = 3.0  # wait for the agent's final messages (end phases, offline)


def run_agent(agent: EdgeAgent, stop: threading.Event, failures: list[BaseException]) -> None:
    """The frame loop in a thread; an exception is kept for the main thread."""
    try:
        agent.run(stop)
    except BaseException as exc:
        logger.exception("edge agent frame loop failed")
        failures.append(exc)
        stop.set()


def progress_line(
    elapsed_s: float, recorder: RunRecorder, agent: EdgeAgent, feed: AlertFeed, fps: float
) -> str:
    """One progress line: frames, rate, escalations, answers, alerts, cloud state."""
    frames, escalated = recorder.snapshot()
    answered = agent.escalation.counters.answered if agent.escalation else 0
    cloud = "connected" if agent.escalation and agent.escalation.connected else "unreachable"
    return (
        f"  [{elapsed_s:5.1f} s] frames {frames:4d} ({fps:4.1f} fps)  escalated {escalated:3d}"
        f"  answers {answered:3d}  alerts {len(feed.events()):2d}  cloud {cloud}"
    )


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--source",
        choices=("synthetic", "real"),
        default="synthetic",
        help="synthetic: the scripted `events` scene, checked against its script (default); "
        "real: OpenCV's `vtest` clip (people on a campus path) with the COCO-80 models",
    )
    add("--seed", type=int, default=1, help="seed of the `events` scene (default 1)")
    add(
        "--loops",
        type=int,
        default=1,
        help="passes of the video to stream (synthetic: 14.4 s each, real: 79.5 s; default 1)",
    )
    add("--duration-s", type=float, help="stream this long instead of whole loops")
    add(
        "--camera",
        choices=("auto", "rtsp", "file"),
        default="auto",
        help="RTSP server (GStreamer) or the file at its frame rate; auto: RTSP if possible",
    )
    add(
        "--broker",
        choices=("auto", "mosquitto", "amqtt"),
        default="auto",
        help="the local broker to start; auto: mosquitto if installed, else amqtt",
    )
    add("--mqtt-host", help="use this broker instead of starting one")
    add("--mqtt-port", type=int, default=1883, help="port of --mqtt-host (default 1883)")
    add(
        "--edge-model",
        choices=("int8", "onnx"),
        default="int8",
        help="committed edge model: INT8 (default) or FP32 ONNX (synthetic: INT8 LiteRT; "
        "real: models/coco/nanodet-coco-int8.onnx or -fp32.onnx)",
    )
    add("--escalation-fps", type=float, default=3.0, help="escalation budget, frames/s (default 3)")
    add("--cloud-threads", type=int, default=1, help="ONNX Runtime threads of the cloud model")
    add(
        "--cloud-cpus",
        type=float,
        default=1.0,
        help="CPU quota of the cloud service's own cgroup, in cores (where the cgroup v1 cpu "
        "controller is writable); default 1",
    )
    add(
        "--cloud-nice",
        type=int,
        default=0,
        help="nice increment of the cloud service's process (0-19; default 0: its cgroup "
        "already keeps it to its share)",
    )
    add(
        "--out",
        type=Path,
        help="output folder (default .cache/demo, real footage: .cache/demo-real)",
    )
    add("--no-video", action="store_true", help="do not write the annotated video")
    add("--progress-s", type=float, default=2.0, help="seconds between progress lines")
    add("--verbose", action="store_true", help="log at INFO level")


def stream(args: argparse.Namespace, s: Stack, say: Printer) -> tuple[float, list[BaseException]]:
    """Run the agent for the asked time, printing progress; returns (seconds run, failures)."""
    scene_s = s.scene_frames / s.scene_fps
    duration_s = args.duration_s if args.duration_s is not None else args.loops * scene_s + TAIL_S
    stop = threading.Event()
    failures: list[BaseException] = []
    say(f"== running for {duration_s:.1f} s (alerts print as they arrive over MQTT)")
    s.agent.start()
    thread = threading.Thread(target=run_agent, args=(s.agent, stop, failures), name="frame-loop")
    thread.start()
    try:
        if not s.recorder.wait_first_frame(FIRST_FRAME_TIMEOUT_S):
            states = [f"{st.state} ({st.reason})" for st in s.agent.status.values()]
            errors = [line for w in s.agent.workers for line in w.source.error_lines()]
            raise DemoError(
                f"the edge agent analysed no frame in {FIRST_FRAME_TIMEOUT_S:.0f} s; camera "
                f"{s.camera_url}: {', '.join(states)}; {' | '.join(errors[-3:]) or 'no errors'}"
            )
        started = time.monotonic()
        last_frames, last_t = 0, started
        while not stop.wait(
            min(args.progress_s, max(0.0, started + duration_s - time.monotonic()))
        ):
            now = time.monotonic()
            frames, _ = s.recorder.snapshot()
            fps = (frames - last_frames) / max(now - last_t, 1e-6)
            last_frames, last_t = frames, now
            say(progress_line(now - started, s.recorder, s.agent, s.feed, fps))
            if now - started >= duration_s:
                break
        ran_s = time.monotonic() - started
    finally:
        stop.set()
        thread.join(30.0)
        s.agent.close(flush_timeout_s=5.0)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while "offline" not in s.feed.availability and time.monotonic() < deadline:
        time.sleep(0.05)
    return ran_s, failures


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m testbed.demo", description=(__doc__ or "").split("\n\n")[0]
    )
    _add_arguments(parser)
    args = parser.parse_args(argv)
    if args.loops < 1 or (args.duration_s is not None and args.duration_s <= 0):
        parser.error("--loops must be >= 1 and --duration-s > 0")
    if args.escalation_fps <= 0 or args.cloud_threads < 1 or args.progress_s <= 0:
        parser.error("--escalation-fps and --progress-s must be > 0, --cloud-threads >= 1")
    if not 0.01 <= args.cloud_cpus <= 64 or not 0 <= args.cloud_nice <= 19:
        parser.error("--cloud-cpus must be in [0.01, 64] cores, --cloud-nice in [0, 19]")
    if args.out is None:
        args.out = CACHE / ("demo-real" if args.source == "real" else "demo")
    real = args.source == "real"
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    say = Printer()
    began = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            s = (start_real_stack if real else start_stack)(args, say, stack)
            ran_s, failures = stream(args, s, say)
            if s.video is not None:
                s.video.close()
            report = (summarise_real if real else summarise)(s, ran_s, args)
    except DemoError as exc:
        say(f"\nDEMO FAILED: {exc}")
        return EXIT_START_FAILED
    except KeyboardInterrupt:
        say("\ninterrupted: everything started was stopped")
        return EXIT_INTERRUPTED
    for line in report.lines:
        say(line)
    say(f"\n(total {time.perf_counter() - began:.1f} s)")
    problems = report.problems + [f"frame loop failed: {exc!r}" for exc in failures]
    for problem in problems:
        say(f"CHECK FAILED: {problem}")
    return EXIT_CHECK_FAILED if problems else EXIT_OK


def summarise(s: Stack, ran_s: float, args: argparse.Namespace) -> Report:
    """The end-of-run summary; see the module docstring."""
    esc = s.agent.escalation.counters if s.agent.escalation is not None else None
    worker = s.agent.workers[0]
    c = worker.counters
    frames = s.recorder.frames
    alerts = s.feed.events()
    alert_latencies = [a.latency_ms for a in alerts if a.payload.get("phase") == "start"]
    match = check_events(s, alerts, ran_s)
    stream_bytes = s.clip.stat().st_size * ran_s / (s.scene_frames / s.scene_fps)
    sent = esc.sent if esc else 0
    bytes_sent = esc.bytes_sent if esc else 0
    accuracy = score_detections(s)

    t = SummaryTable()
    t.section("run")
    t.add("camera", f"{s.camera}: {s.camera_url}")
    t.add("broker", s.broker)
    t.add("streamed", f"{ran_s:.1f} s")
    t.section("edge")
    t.add("frames analysed", f"{frames} ({frames / max(ran_s, 1e-6):.1f} fps)")
    stale = worker.source.stats().drops + c.skipped_rate
    pace = pace_of(frames, ran_s, s.scene_fps, stale)
    t.add("frames dropped (stale)", str(stale))
    t.add("edge vs camera", pace.text())
    t.add(
        "focus crops",
        f"{c.focus_crops} looked at, {s.agent.focus_budget.skipped} left out "
        "(no time left in the frame period)",
    )
    t.add("detection mAP50 / recall", accuracy)
    add_cloud_rows(t, s.agent, frames, stream_bytes)
    t.section("latency")
    t.add("capture -> frame results", latency_text(s.recorder.latencies_ms))
    t.add("capture -> alert via MQTT", latency_text(alert_latencies))
    t.section(f"alerts ({len(alerts)} messages)")
    lines = ["", "== summary", *t.lines()]
    lines += [f"  {a.line}" for a in alerts]
    lines += [
        f"-- expected events (first scene loop, +-{TOLERANCE_S:g} s)",
        f"  {match_text(match)}",
    ]
    lines += [f"  {row}" for row in match.report().splitlines()[1:]]
    lines += video_lines(s.video)

    problems = []
    if frames == 0:
        problems.append("no frame was analysed")
    if esc is not None and esc.answered == 0:
        problems.append("the cloud answered no escalated frame")
    if not match.ok:
        problems.append("the alerts do not match the scene's scripted events")
    if s.video is not None and (s.video.error or s.video.frames_written == 0):
        problems.append(f"annotated video not written: {s.video.error or 'no frames'}")
    numbers = {
        "frames_analysed": frames,
        "streamed_s": ran_s,
        "pace": pace.numbers(),
        "escalated": sent,
        "escalated_share": sent / max(frames, 1),
        "hard_reasons": dict(esc.hard_reasons) if esc else {},
        "sent_reasons": dict(esc.sent_reasons) if esc else {},
        "answered": esc.answered if esc else 0,
        "bytes_sent": bytes_sent,
        "fusion": dataclasses.asdict(c.fusion),
        "latency_ms": {"results": s.recorder.latencies_ms, "alerts": alert_latencies},
        "alerts": [a.payload for a in alerts],
        "expected": {
            "matched": len(match.matched),
            "missing": len(match.missing),
            "unexpected": len(match.unexpected),
            "ok": match.ok,
        },  # fmt: skip
        "video": str(s.video.path) if s.video else None,
        "video_frames": s.video.frames_written if s.video else 0,
        "problems": problems,
    }
    return Report.written(args.out, lines, problems, numbers)


def check_events(s: Stack, alerts: list[Any], ran_s: float) -> EventMatch:
    """The received alerts against the scene's scripted events (first loop, or what ran of it)."""
    assert s.scene is not None and s.scene.events is not None  # noqa: S101 - synthetic has them
    window_s = min(s.scene_frames / s.scene_fps, ran_s)
    expected = [e for e in load_expected(s.scene.events) if e.time_s < window_s - TOLERANCE_S / 2]
    observed = observed_from_payloads([a.payload for a in alerts], s.models.class_names, 0.0)
    _, match = match_first_loop(expected, observed, duration_s=window_s, tolerance_s=TOLERANCE_S)
    return match


def match_text(match: EventMatch) -> str:
    """`matched 9/9, missing 0, unexpected 0: OK`."""
    expected = len(match.matched) + len(match.missing)
    verdict = "OK" if match.ok else "MISMATCH"
    return (
        f"matched {len(match.matched)}/{expected}, missing {len(match.missing)}, "
        f"unexpected {len(match.unexpected)}, out of order {len(match.out_of_order)}: {verdict}"
    )


def score_detections(s: Stack) -> str:
    """mAP50 and recall of the agent's tracked output on the first loop's frames, or why not."""
    n_frames = s.scene_frames
    found = [(i, d) for i, d in s.recorder.detections if i < n_frames]
    if not found:
        return "n/a (no frames of the first loop)"
    assert s.scene is not None  # noqa: S101 - synthetic source
    truth = ground_truth(s.scene.gt, n_frames)
    result = compute_metrics(
        [truth[i] for i, _ in found], [d for _, d in found], class_names=s.models.class_names
    )
    return (
        f"{result.map50:.3f} / {result.overall.recall:.3f} on {len(found)} frames "
        "(tracked output vs the scene's ground truth)"
    )


if __name__ == "__main__":
    sys.exit(main())
