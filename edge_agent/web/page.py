"""The status page: one HTML document, rendered from a status report, with a little vanilla JS.

The server renders the page complete (every name HTML-escaped), so it reads without JavaScript;
the script then polls `/api/status` every second and updates the fields in place (`textContent`,
never `innerHTML`), swaps each camera's image when its frame index moves, and redraws the event
list when it changes. No build step, no framework, no external resources: the inline script and
style are allowed by their hashes in the Content-Security-Policy (`CONTENT_SECURITY_POLICY`).
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Mapping

__all__ = ["CONTENT_SECURITY_POLICY", "render_page"]

_STYLE = """
:root { color-scheme: light dark; --ok: #1a7f37; --warn: #b26b00; --bad: #c62828; --dim: #6e7781; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 1.2rem 2rem; }
header.top { display: flex; align-items: baseline; gap: 1rem; flex-wrap: wrap; }
h1 { font-size: 1.3rem; margin: 0.8rem 0; }
h2 { font-size: 1.05rem; margin: 0; overflow-wrap: anywhere; }
.muted { color: var(--dim); }
.alert { color: var(--bad); }
.cameras { display: grid; gap: 1rem;
  grid-template-columns: repeat(auto-fill, minmax(min(100%, 560px), 1fr)); }
.camera { border: 1px solid #8884; border-radius: 6px; padding: 0.6rem; }
.camera header { display: flex; justify-content: space-between; align-items: center; gap: 0.5rem; }
.frame { margin: 0.5rem 0; background: #0002; aspect-ratio: 16 / 9; display: flex;
  align-items: center; justify-content: center; }
.frame img { width: 100%; height: 100%; object-fit: contain; display: block; }
.frame img[hidden], .frame p[hidden] { display: none; }
.state { border-radius: 4px; padding: 0.1rem 0.5rem; color: #fff; background: var(--dim); }
.state-streaming { background: var(--ok); }
.state-connecting, .state-stalled, .state-reconnecting { background: var(--warn); }
.state-error { background: var(--bad); }
dl { display: grid; grid-template-columns: repeat(3, 1fr); gap: 0.3rem 1rem; margin: 0.4rem 0; }
dl div { display: flex; justify-content: space-between; gap: 0.5rem; }
dt { color: var(--dim); }
dd { margin: 0; font-variant-numeric: tabular-nums; }
.caption { margin: -0.3rem 0 0.3rem; text-align: right; font-size: 0.85rem; }
.reason, .error { margin: 0.2rem 0; overflow-wrap: anywhere; }
main > section + section { margin-top: 1.5rem; }
.error { color: var(--bad); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 0.25rem 0.5rem; border-bottom: 1px solid #8883;
  vertical-align: middle; }
td img { width: 96px; height: auto; display: block; }
"""

_SCRIPT = """
"use strict";
const STATES = new Set(["connecting", "streaming", "stalled", "reconnecting", "stopped", "error"]);
const cards = new Map();
for (const card of document.querySelectorAll("article.camera")) {
  cards.set(card.dataset.camera, card);
}
const tbody = document.getElementById("events");
const noEvents = document.getElementById("no-events");
const updated = document.getElementById("updated");
const problem = document.getElementById("problem");
let eventsKey = null;

function field(card, name) { return card.querySelector('[data-field="' + name + '"]'); }
function setText(element, text) { if (element.textContent !== text) element.textContent = text; }
function count(value) { return typeof value === "number" ? String(value) : "\\u2013"; }
function text(value) { return typeof value === "string" ? value : "\\u2013"; }
function modelText(m) {
  return m && typeof m.name === "string" && typeof m.version === "string"
    ? m.name + ":" + m.version : "\\u2013";
}
function link(value) {
  return typeof value === "string" && /^(https?:\\/\\/|\\/(?!\\/))/.test(value) ? value : null;
}

function reasonText(s) {
  const since = typeof s.since === "string" ? "since " + s.since.slice(11, 19) + " UTC" : "";
  const reason = typeof s.reason === "string" ? s.reason : "";
  return since && reason ? since + ": " + reason : since || reason;
}

function updateCamera(card, camera) {
  const s = camera.status || {};
  const state = typeof s.state === "string" ? s.state : "unknown";
  const badge = field(card, "state");
  setText(badge, state);
  badge.className = "state state-" + (STATES.has(state) ? state : "other");
  setText(field(card, "reason"), reasonText(s));
  setText(field(card, "fps"), typeof s.fps === "number" ? s.fps.toFixed(1) : "\\u2013");
  setText(field(card, "frames"), count(s.frames_analysed));
  setText(field(card, "dropped"), count(s.frames_dropped));
  setText(field(card, "reconnects"), count(s.reconnects));
  setText(field(card, "cloud"), text(s.cloud));
  setText(field(card, "model"), modelText(s.model));
  const error = field(card, "error");
  error.hidden = !s.last_error;
  setText(error, s.last_error ? "last error: " + s.last_error : "");
  const image = field(card, "image");
  const frame = camera.frame;
  if (frame) {
    const age = frame.age_s.toFixed(1);
    setText(field(card, "frame"), "#" + frame.index + " \\u00b7 " + age + " s old");
    if (image.getAttribute("src") !== frame.url && link(frame.url)) {
      image.src = frame.url;
    }
    image.hidden = false;
    field(card, "noframe").hidden = true;
  } else {
    setText(field(card, "frame"), "\\u2013");
  }
}

function cell(row, value) {
  const td = document.createElement("td");
  td.textContent = value;
  row.appendChild(td);
  return td;
}

function eventRow(entry) {
  const e = entry.event;
  const row = document.createElement("tr");
  const stamp = typeof e.timestamp === "string" ? e.timestamp : "";
  cell(row, stamp.slice(11, 23)).title = stamp;
  cell(row, text(e.camera));
  cell(row, text(e.rule));
  cell(row, text(e.kind));
  cell(row, text(e.phase));
  const track = typeof e.track_id === "number" ? " #" + e.track_id : "";
  cell(row, (typeof e.label === "string" ? e.label : "") + track);
  const media = cell(row, "");
  const links = entry.links || {};
  const picture = link(links.snapshot) || link(links.crop);
  if (picture) {
    const a = document.createElement("a");
    a.href = picture;
    const img = document.createElement("img");
    img.src = picture;
    img.alt = "snapshot of " + text(e.rule);
    img.loading = "lazy";
    a.appendChild(img);
    media.appendChild(a);
  }
  const clip = link(links.clip);
  if (clip) {
    const a = document.createElement("a");
    a.href = clip;
    a.textContent = "clip";
    media.appendChild(a);
  }
  return row;
}

function renderEvents(events) {
  const key = events.map((x) => [x.event.event_id, x.event.phase, x.event.timestamp].join("|"))
    .join(",");
  if (key === eventsKey) return;
  eventsKey = key;
  tbody.replaceChildren(...events.map(eventRow));
  noEvents.hidden = events.length > 0;
}

async function poll() {
  try {
    const response = await fetch("/api/status", { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    const report = await response.json();
    for (const camera of report.cameras) {
      const card = cards.get(camera.name);
      if (card) updateCamera(card, camera);
    }
    renderEvents(report.events);
    setText(updated, "updated " + String(report.generated).slice(11, 19) + " UTC");
    problem.hidden = true;
  } catch (error) {
    setText(problem, "status unavailable: " + error.message);
    problem.hidden = false;
  } finally {
    setTimeout(poll, 1000);
  }
}
setTimeout(poll, 1000);
"""


def _source_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


CONTENT_SECURITY_POLICY = (
    "default-src 'none'; "
    f"script-src {_source_hash(_SCRIPT)}; style-src {_source_hash(_STYLE)}; "
    "img-src 'self' http: https:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""Only this page's own script and style run; images from here (and event media URLs)."""

_STATES = frozenset({"connecting", "streaming", "stalled", "reconnecting", "stopped", "error"})
_DASH = "\u2013"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _text(value: object) -> str:
    return value if isinstance(value, str) else _DASH


def _model_text(value: object) -> str:
    """`name:version` of a status document's `model` (the fleet's names where it manages it)."""
    if not isinstance(value, Mapping):
        return _DASH
    name, version = value.get("name"), value.get("version")
    return f"{name}:{version}" if isinstance(name, str) and isinstance(version, str) else _DASH


def _count(value: object) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else _DASH


def _link(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    if value.startswith(("http://", "https://")) or (
        value.startswith("/") and not value.startswith("//")
    ):
        return value
    return None


def _reason_text(status: Mapping[str, object]) -> str:
    since, reason = status.get("since"), status.get("reason")
    since_text = f"since {since[11:19]} UTC" if isinstance(since, str) else ""
    reason_text = reason if isinstance(reason, str) else ""
    if since_text and reason_text:
        return f"{since_text}: {reason_text}"
    return since_text or reason_text


def _camera(camera: Mapping[str, object]) -> str:
    name = str(camera.get("name"))
    raw_status = camera.get("status")
    status: Mapping[str, object] = raw_status if isinstance(raw_status, Mapping) else {}
    state = status.get("state") if isinstance(status.get("state"), str) else "unknown"
    badge = state if state in _STATES else "other"
    fps = status.get("fps")
    raw_frame = camera.get("frame")
    frame: Mapping[str, object] | None = raw_frame if isinstance(raw_frame, Mapping) else None
    alt = f' alt="live view of {_e(name)}"'
    frame_text, image = _DASH, f'<img data-field="image"{alt} hidden>'
    if frame is not None:
        age = frame.get("age_s")
        seconds = age if isinstance(age, int | float) else 0.0
        frame_text = f"#{frame.get('index')} \u00b7 {seconds:.1f} s old"
        url = _link(frame.get("url"))
        if url is not None:
            image = f'<img data-field="image" src="{_e(url)}"{alt}>'
    error = status.get("last_error")
    error_text = f"last error: {error}" if isinstance(error, str) and error else ""
    reason_text = _reason_text(status)
    rows = [
        ("fps", "fps", f"{fps:.1f}" if isinstance(fps, int | float) else _DASH),
        ("frames", "frames", _count(status.get("frames_analysed"))),
        ("dropped", "dropped", _count(status.get("frames_dropped"))),
        ("reconnects", "reconnects", _count(status.get("reconnects"))),
        ("cloud", "cloud", _text(status.get("cloud"))),
        ("model", "model", _model_text(status.get("model"))),
    ]
    fields = "".join(
        f'<div><dt>{label}</dt><dd data-field="{key}">{_e(value)}</dd></div>'
        for label, key, value in rows
    )
    return (
        f'<article class="camera" data-camera="{_e(name)}">'
        f"<header><h2>{_e(name)}</h2>"
        f'<span class="state state-{badge}" data-field="state">{_e(state)}</span></header>'
        f'<div class="frame">{image}'
        f'<p class="muted" data-field="noframe"{" hidden" if frame else ""}>no frame yet</p></div>'
        f'<p class="caption muted">frame <span data-field="frame">{_e(frame_text)}</span></p>'
        f'<p class="reason muted" data-field="reason">{_e(reason_text)}</p>'
        f"<dl>{fields}</dl>"
        f'<p class="error" data-field="error"{"" if error_text else " hidden"}>{_e(error_text)}</p>'
        "</article>"
    )


def _event(entry: Mapping[str, object]) -> str:
    raw_event, raw_links = entry.get("event"), entry.get("links")
    event: Mapping[str, object] = raw_event if isinstance(raw_event, Mapping) else {}
    links: Mapping[str, object] = raw_links if isinstance(raw_links, Mapping) else {}
    stamp = event.get("timestamp") if isinstance(event.get("timestamp"), str) else ""
    track = event.get("track_id")
    label = event.get("label") if isinstance(event.get("label"), str) else ""
    who = f"{label}{f' #{track}' if isinstance(track, int) else ''}"
    media = ""
    picture = _link(links.get("snapshot")) or _link(links.get("crop"))
    if picture is not None:
        alt = f"snapshot of {_text(event.get('rule'))}"
        media += (
            f'<a href="{_e(picture)}"><img src="{_e(picture)}" alt="{_e(alt)}" loading="lazy"></a>'
        )
    clip = _link(links.get("clip"))
    if clip is not None:
        media += f'<a href="{_e(clip)}">clip</a>'
    cells = [
        f'<td title="{_e(stamp)}">{_e(str(stamp)[11:23])}</td>',
        *(f"<td>{_e(_text(event.get(key)))}</td>" for key in ("camera", "rule", "kind", "phase")),
        f"<td>{_e(who)}</td>",
        f"<td>{media}</td>",
    ]
    return f"<tr>{''.join(cells)}</tr>"


def _entries(report: Mapping[str, object], key: str) -> list[Mapping[str, object]]:
    items = report.get(key)
    if not isinstance(items, list):
        return []
    return [item for item in items if isinstance(item, Mapping)]


def render_page(report: Mapping[str, object]) -> str:
    """The whole page for one status report (`report.status_report`)."""
    agent = report.get("agent")
    title = f"Edge agent {agent}" if isinstance(agent, str) and agent else "Edge agent"
    generated = str(report.get("generated", ""))
    cameras = "".join(_camera(camera) for camera in _entries(report, "cameras"))
    events = _entries(report, "events")
    rows = "".join(_event(entry) for entry in events)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} \u2013 status</title><style>{_STYLE}</style></head><body>"
        f'<header class="top"><h1>{_e(title)}</h1>'
        f'<span class="muted" id="updated">updated {_e(generated[11:19])} UTC</span>'
        '<span class="alert" id="problem" hidden></span></header>'
        f'<main><section class="cameras" aria-label="cameras">{cameras}</section>'
        "<section><h2>Recent events</h2><table><thead><tr><th>time (UTC)</th><th>camera</th>"
        "<th>rule</th><th>kind</th><th>phase</th><th>object</th><th>media</th></tr></thead>"
        f'<tbody id="events">{rows}</tbody></table>'
        f'<p class="muted" id="no-events"{" hidden" if events else ""}>no events yet</p>'
        f"</section></main><script>{_SCRIPT}</script></body></html>\n"
    )
