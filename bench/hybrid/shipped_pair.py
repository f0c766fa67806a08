"""The shipped edge and cloud example configs together on a CPU box: are the escalations answered?

The shipped edge example's `escalation:` section (pointed at loopback, no TLS or token: only the
address changes) sends real `vtest` frames, whole, at its own per-camera budget
(`per_camera_frames_per_s`) through the agent's real `EscalationStage` to `cloud-service serve`
on the shipped `configs/cloud-service.cpu.yaml` (listen address changed) in its own process.
Counted per frame: answered, expired (the edge's `deadline_ms` passed), other failures, and
whether the agent's deadline watch reported a mismatch. Variants side by side in one run: the
other core idle, and the other core kept busy by a spinning process (edge boxes and CI machines
are rarely idle). Prints a table and writes `bench/results/shipped_pair.md` and `.json`.

    python -m bench.hybrid.shipped_pair [--frames 120]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import yaml

from bench import harness
from bench.harness import CACHE, REPO_ROOT, RESULTS
from cloud_service.config import CloudServiceConfig
from edge_agent.capture import CapturedFrame
from edge_agent.config.escalation import EscalationConfig
from edge_agent.escalation import EscalationClient, EscalationDecision
from edge_agent.metrics import EdgeMetrics
from edge_agent.pipeline.escalation import EscalationStage
from testbed.demo_stack import start_cloud_service
from testbed.media import sample_clip

CONFIGS = REPO_ROOT / "configs"
CONNECT_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Result:
    """One variant's count of escalations and what came of them."""

    name: str
    sent: int
    answered: int
    expired: int
    other: int
    answered_share: float
    rtt_ms_median: float
    rtt_ms_p90: float
    mismatch: bool
    load_average: float


def shipped_escalation(address: str) -> EscalationConfig:
    """The edge example's `escalation:` section, pointed at `address` (plain gRPC, no token)."""
    document = yaml.safe_load((CONFIGS / "edge-agent.example.yaml").read_text())["escalation"]
    document.update({"cloud_address": address, "tls": False})
    for key in ("tls_ca_path", "auth_token"):
        document.pop(key, None)
    return EscalationConfig.model_validate(document)


def shipped_cloud() -> CloudServiceConfig:
    """The shipped CPU cloud config on a free loopback port."""
    document = yaml.safe_load((CONFIGS / "cloud-service.cpu.yaml").read_text())
    document["server"]["listen_address"] = "127.0.0.1:0"
    return CloudServiceConfig.model_validate(document)


def clip_frames(count: int) -> list[npt.NDArray[np.uint8]]:
    """The first `count` frames of vtest (looped if it is shorter)."""
    capture = cv2.VideoCapture(str(sample_clip(CACHE / "media", name="vtest")), cv2.CAP_FFMPEG)
    frames: list[npt.NDArray[np.uint8]] = []
    try:
        while len(frames) < count:
            ok, image = capture.read()
            if not ok:
                if not frames:
                    raise RuntimeError("vtest: no frame decoded")
                capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
                continue
            frames.append(np.asarray(image, dtype=np.uint8))
    finally:
        capture.release()
    return frames


@contextlib.contextmanager
def busy_core(busy: bool) -> Iterator[None]:
    """A process spinning on one core while the block runs (when `busy`)."""
    if not busy:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # noqa: S603
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def run_variant(
    name: str, address: str, frames: list[npt.NDArray[np.uint8]], *, busy: bool
) -> Result:
    """Escalate every frame at the example's per-camera rate; count what came back."""
    config = shipped_escalation(address)
    every_s = 1.0 / config.per_camera_frames_per_s
    client = EscalationClient(config, "bench-agent")
    stage = EscalationStage(config, "bench-agent", client, metrics=EdgeMetrics())
    decision = EscalationDecision(send=True, score=1.0, reasons=("refresh",))
    answered = expired = other = sent = 0
    rtts: list[float] = []
    with busy_core(busy):
        stage.start()
        try:
            if not stage.client.wait_connected(CONNECT_TIMEOUT_S):
                raise RuntimeError(f"no connection to {address}: {stage.client.stats()}")
            load = harness.load_average()
            last_send = time.monotonic() + DRAIN_TIMEOUT_S
            while sent < len(frames) or (
                answered + expired + other < sent and time.monotonic() < last_send
            ):
                if sent < len(frames):
                    frame = CapturedFrame("cam", sent, time.time(), time.monotonic(), frames[sent])
                    sent += int(stage.submit("cam", frame, decision))
                    last_send = time.monotonic() + DRAIN_TIMEOUT_S
                for result in stage.poll():
                    if result.ok:
                        answered += 1
                        if result.rtt_s is not None:
                            rtts.append(1000.0 * result.rtt_s)
                    elif result.code.name == "DEADLINE_EXCEEDED":
                        expired += 1
                    else:
                        other += 1
                time.sleep(every_s)
            mismatch = bool(stage.deadline_status()["mismatch"])
        finally:
            stage.close()
    quantiles = statistics.quantiles(rtts, n=10) if len(rtts) >= 2 else [0.0] * 9
    return Result(
        name=name,
        sent=sent,
        answered=answered,
        expired=expired,
        other=other,
        answered_share=round(answered / sent, 3) if sent else 0.0,
        rtt_ms_median=round(statistics.median(rtts), 1) if rtts else 0.0,
        rtt_ms_p90=round(quantiles[8], 1),
        mismatch=mismatch,
        load_average=round(load, 1),
    )


def table(results: list[Result]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| variant | sent | answered | expired | other | answered share "
        "| round trip ms (median / p90) | mismatch reported | load average |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.sent} | {r.answered} | {r.expired} | {r.other} "
            f"| {100 * r.answered_share:.1f} % | {r.rtt_ms_median} / {r.rtt_ms_p90} "
            f"| {'yes' if r.mismatch else 'no'} | {r.load_average} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run both variants and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=120, help="frames escalated per variant")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = parser.parse_args(argv)
    if args.frames < 1:
        parser.error("--frames must be at least 1")
    frames = clip_frames(args.frames)
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pair-")))
        cloud = start_cloud_service(shipped_cloud(), folder, stack, cores=None)
        address = f"127.0.0.1:{cloud.port}"
        for name, busy in (("other core idle", False), ("other core busy", True)):
            results.append(run_variant(name, address, frames, busy=busy))
    text = table(results)
    print(text)
    config = shipped_escalation("127.0.0.1:1")  # only its budget and deadline are read here
    header = (
        "# The shipped edge and cloud example configs together\n\n"
        f"`{harness.command_line(__spec__.name, argv)}`"
        f" on {harness.machine()}: `configs/edge-agent.example.yaml`'s escalation "
        f"({config.per_camera_frames_per_s:g} frames/s per camera, deadline "
        f"{config.deadline_ms} ms) sending {args.frames} whole vtest frames to "
        "`cloud-service serve --config configs/cloud-service.cpu.yaml` (own process) per "
        "variant; only the addresses changed.\n\n"
    )
    document: dict[str, Any] = {
        "frames": args.frames,
        "results": [asdict(r) for r in results],
    }
    harness.write_results("shipped_pair", header + text, document, args.out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
