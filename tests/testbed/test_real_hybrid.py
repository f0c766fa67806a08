"""The hybrid trade-off on real footage (`bench.real_hybrid`) on a few frames of `vtest`
(people in every frame, so every score is defined)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import real_hybrid


def test_real_footage_trade_off_writes_one_record_per_variant(tmp_path: Path) -> None:
    assert real_hybrid.main(["--clips", "vtest", "--frames", "12", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "real_hybrid.json").read_text())
    records = {r["name"]: r for r in results["variants"]}
    assert {"edge only", "cloud only", "hybrid 2 f/s", "oracle 2 f/s"} <= set(records)
    cloud = records["cloud only"]["clips"]["vtest"]
    assert cloud["escalated_fraction"] == 1.0 and cloud["kb_per_s"] > 0
    assert records["edge only"]["clips"]["vtest"]["escalated_fraction"] == 0.0
    for record in records.values():
        assert 0.0 <= record["map50"] <= 1.0 and 0.0 <= record["f1"] <= 1.0
    assert "hybrid 2 f/s" in (tmp_path / "real_hybrid.md").read_text()
