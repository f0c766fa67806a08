"""What abusive clients cost the edge agent's status page: resident memory of the server process.

    python -m bench.edge.web_abuse [--server new|old] [--mib 200] [--results-dir bench/results]

Each probe starts the status page alone in a fresh child process (`--serve`: basic auth, bound
to 0.0.0.0 as on a box reachable from the LAN, `client_timeout_s` 2 s, a 32 MiB media file),
samples its resident set (VmRSS) every 20 ms while the probe runs, then checks that it still
answers `/healthz`. Probes (issue 32's, and the abuse tests' at scale):

- `cl-minus-1`: `POST /api/reload` with `Content-Length: -1`, then `--mib` MiB, no credentials;
- `cl-huge`: `Content-Length: 2**40`, then `--mib` MiB, no credentials;
- `chunked`: a chunked body of `--mib` MiB to `POST /api/reload`, with credentials;
- `idle-heads`: 500 connections that send half a request head and nothing more, held 6 s;
- `silent-readers`: 10 clients that request the 32 MiB file and never read, held 6 s.

`--server old` runs the stdlib `ThreadingHTTPServer` version this replaced (`edge_agent/web/
server.py` as of commit 720c258, read from git) for comparison. Prints a markdown table and
writes `web_abuse_<server>.json` beside it.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from bench import harness
from bench.harness import REPO_ROOT, RESULTS

OLD_SERVER_COMMIT = "720c258"
_PASSWORD = "bench-pass"  # noqa: S105 (a throwaway secret for the child process)
_BLOCK = b"x" * 1_048_576


@dataclass
class ProbeResult:
    """One probe against one fresh server process."""

    probe: str
    status: str  # the first status line the client saw, or "closed" / "none"
    sent_mib: float  # what the client got onto the wire before the server stopped it
    rss_before_mib: float
    rss_peak_mib: float
    rss_after_mib: float
    growth_mib: float  # peak - before
    seconds: float
    healthy_after: bool


def _load_old_server() -> ModuleType:
    source = subprocess.run(  # noqa: S603 (fixed argv)
        ["git", "show", f"{OLD_SERVER_COMMIT}:edge_agent/web/server.py"],  # noqa: S607
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="old-server-")) / "old_status_server.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_status_server", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve(kind: str, media_dir: Path) -> None:
    """Child: run the status page until stdin closes; print its port first."""
    from edge_agent.config.web import WebConfig
    from edge_agent.web import LiveView

    if kind == "old":
        server_class: Any = _load_old_server().StatusServer
    else:
        from edge_agent.web import StatusServer

        server_class = StatusServer
    config = WebConfig.model_validate(
        {
            "port": 0,
            "host": "0.0.0.0",  # noqa: S104 (the probe of the issue: a LAN-facing box)
            "client_timeout_s": 2.0,
            "auth": {"type": "basic", "username": "viewer", "password": {"env": "BENCH_PW"}},
        }
    )
    server = server_class(
        config,
        LiveView(),
        dict,
        lambda relative: media_dir / relative,
        environ={"BENCH_PW": _PASSWORD},
        reload=lambda: {"ok": True, "message": "bench"},
    )
    server.start()
    print(server.port, flush=True)
    sys.stdin.read()
    server.close()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _head(method: str, path: str, port: int, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status_of(sock: socket.socket, wait_s: float) -> str:
    sock.settimeout(wait_s)
    try:
        data = sock.recv(4096)
    except OSError:
        return "closed"
    if not data:
        return "closed"
    return data.split(b"\r\n", 1)[0].decode("latin-1", "replace")


def _push_body(port: int, head: bytes, mib: int, chunked: bool = False) -> tuple[str, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        sent = 0
        try:
            for _ in range(mib):
                if chunked:
                    sock.sendall(b"%x\r\n" % len(_BLOCK) + _BLOCK + b"\r\n")
                else:
                    sock.sendall(_BLOCK)
                sent += len(_BLOCK)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        return _status_of(sock, 10.0), sent / 2**20


def _credentials() -> str:
    return "Basic " + base64.b64encode(f"viewer:{_PASSWORD}".encode()).decode()


def _probe_cl(length: str) -> Callable[[int, int], tuple[str, float]]:
    def run(port: int, mib: int) -> tuple[str, float]:
        head = _head("POST", "/api/reload", port, {"Content-Length": length})
        return _push_body(port, head, mib)

    return run


def _probe_chunked(port: int, mib: int) -> tuple[str, float]:
    headers = {
        "Authorization": _credentials(),
        "Transfer-Encoding": "chunked",
        "Content-Type": "application/json",
    }
    return _push_body(port, _head("POST", "/api/reload", port, headers), mib, chunked=True)


def _hold(sockets: list[socket.socket], seconds: float) -> str:
    time.sleep(seconds)
    still_open = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            while sock.recv(1 << 20):  # what the buffers held, then EOF or a reset
                pass
        except BlockingIOError:
            still_open += 1  # nothing more, and no close: the server still holds it
        except OSError:
            pass
        sock.close()
    return f"{still_open} of {len(sockets)} still open after {seconds:.0f} s"


def _probe_idle_heads(port: int, mib: int) -> tuple[str, float]:
    sockets = []
    for _ in range(500):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        sockets.append(sock)
    return _hold(sockets, 6.0), 0.0


def _probe_silent_readers(port: int, mib: int) -> tuple[str, float]:
    sockets = []
    headers = {"Authorization": _credentials()}
    for _ in range(10):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(_head("GET", "/media/cam/clip.mp4", port, headers))
        sockets.append(sock)
    return _hold(sockets, 6.0), 0.0


PROBES: dict[str, Callable[[int, int], tuple[str, float]]] = {
    "cl-minus-1": _probe_cl("-1"),
    "cl-huge": _probe_cl(str(2**40)),
    "chunked": _probe_chunked,
    "idle-heads": _probe_idle_heads,
    "silent-readers": _probe_silent_readers,
}


def _healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(_head("GET", "/healthz", port, {"Connection": "close"}))
            return " 200" in _status_of(sock, 10.0)
    except OSError:
        return False


def run_probe(name: str, server: str, mib: int, media_dir: Path) -> ProbeResult:
    """`name` against a fresh `server` process."""
    child = subprocess.Popen(  # noqa: S603 (our own module)
        [
            sys.executable,
            "-m",
            "bench.edge.web_abuse",
            "--serve",
            server,
            "--media-dir",
            str(media_dir),
        ],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        time.sleep(0.5)
        before = _rss_mib(child.pid)
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak.append(_rss_mib(child.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        status, sent = PROBES[name](port, mib)
        seconds = time.monotonic() - started
        time.sleep(0.5)
        done.set()
        sampler.join()
        after = _rss_mib(child.pid)
        healthy = _healthy(port)
        child.stdin.close()
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    top = max(peak)
    return ProbeResult(
        name, status, round(sent, 1), round(before, 1), round(top, 1), round(after, 1),
        round(top - before, 1), round(seconds, 2), healthy,
    )  # fmt: skip


def _table(results: list[ProbeResult], server: str) -> str:
    lines = [
        f"server: {server}",
        "",
        "| probe | answer | MiB sent | RSS before | RSS peak | growth (MiB) | s | /healthz after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.probe} | {r.status} | {r.sent_mib} | {r.rss_before_mib} | {r.rss_peak_mib} "
            f"| **{r.growth_mib}** | {r.seconds} | {'yes' if r.healthy_after else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--server", choices=("new", "old"), default="new")
    parser.add_argument("--mib", type=int, default=200, help="Body size of the body probes.")
    parser.add_argument("--probes", default=",".join(PROBES), help="Comma-separated subset.")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--serve", choices=("new", "old"), help=argparse.SUPPRESS)
    parser.add_argument("--media-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.media_dir)
        return 0
    with tempfile.TemporaryDirectory(prefix="web-abuse-") as tmp:
        media = Path(tmp)
        (media / "cam").mkdir()
        (media / "cam" / "clip.mp4").write_bytes(b"\0" * (32 * 2**20))
        results = [run_probe(name, args.server, args.mib, media) for name in args.probes.split(",")]
    table = _table(results, args.server)
    print(table)
    document = {
        "server": args.server,
        "mib": args.mib,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": [asdict(r) for r in results],
    }
    stem = f"web_abuse_{args.server}"
    harness.write_results(stem, table, document, args.results_dir, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
