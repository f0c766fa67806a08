"""The hybrid trade-off on real footage (`bench.hybrid.real_hybrid`) on a few frames of `vtest`
(people in every frame, so every score is defined)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.hybrid import real_hybrid
from bench.models.truth import Tally


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
        assert 0.0 <= record["reference_map50"] <= 1.0
        # scored on the hand-verified truth's frames within the 12 simulated: 0 and 10
        assert record["clips"]["vtest"]["truth_frames"] == 2
    assert 0.0 <= records["edge only"]["f1_person"] <= 1.0
    document = (tmp_path / "real_hybrid.md").read_text()
    assert "hybrid 2 f/s" in document and "hand-verified truth" in document
    # how sure: intervals of the hybrid's lead over the edge, each a [low, high] pair
    intervals = results["intervals"]
    assert intervals["variant"] == "hybrid 2 f/s" and intervals["level"] == 0.9
    for cell in intervals["hybrid_minus_edge"]["vtest"].values():
        if cell["low"] is not None:
            assert -1.0 <= cell["low"] <= cell["high"] <= 1.0
    assert "paired bootstrap over the truth frames" in document


def _frames(hits: list[bool]) -> list[dict[str, Tally]]:
    """One truth frame per entry: a person found (True) or a false box and a miss."""
    return [
        {
            "person": Tally(truth=1, scores=[0.9], hits=[hit]),
            "vehicles": Tally(truth=1, scores=[0.9], hits=[True]),
        }
        for hit in hits
    ]


def test_a_change_is_told_apart_from_the_row_it_changes_on_the_same_frames() -> None:
    """The recovery rows' intervals: with minus without per clip, paired over the frames; a
    pair missing from a clip is left out rather than drawn on part of the clips."""
    base, better = _frames([False, True] * 10), _frames([True, True] * 10)
    per_frame = {"vtest": {"a": base, "b": better, "c": base}, "bikes": {"a": base, "b": better}}
    differences = real_hybrid._differences(per_frame, [("a", "b"), ("a", "c")])
    assert list(differences) == ["b - a"]  # c did not run on bikes
    for clip in ("vtest", "bikes"):
        person = differences["b - a"][clip]["f1_person"]
        assert 0.0 < person["low"] <= person["high"]  # better on every frame: surely better
        vehicles = differences["b - a"][clip]["f1_vehicles"]
        assert vehicles["low"] == vehicles["high"] == 0.0
    line = real_hybrid.difference_lines(differences)
    assert line.startswith("Changes told apart") and "b - a: vtest: mAP50 [" in line
    assert real_hybrid.difference_lines({}) == ""


def test_the_recovery_rows_are_paired_with_the_rows_they_change() -> None:
    names = {v.name for v in real_hybrid.variants()}
    for pair in real_hybrid._paired():
        assert set(pair) <= names


def test_gap_closed_is_the_share_of_the_edge_to_cloud_difference() -> None:
    assert real_hybrid.gap_closed(0.75, 0.5, 1.0) == 0.5
    assert real_hybrid.gap_closed(0.4, 0.5, 1.0) == pytest.approx(-0.2)  # worse than the edge
    assert math.isnan(real_hybrid.gap_closed(0.9, 0.8, 0.7))  # the cloud is not better


def test_only_reads_variant_names_that_hold_commas() -> None:
    chosen = real_hybrid.selected_variants("cloud only,hybrid 2 f/s, JPEG uplink,hybrid 2 f/s")
    assert [v.name for v in chosen] == ["cloud only", "hybrid 2 f/s", "hybrid 2 f/s, JPEG uplink"]
    assert len(real_hybrid.selected_variants(None)) == len(real_hybrid.variants())


@pytest.mark.parametrize("only", ["", "no such row", "edge only,,cloud only", "hybrid 2 f/s, x"])
def test_only_refuses_a_name_that_is_no_variant(only: str) -> None:
    with pytest.raises(ValueError, match="no variant is named"):
        real_hybrid.selected_variants(only)


def test_only_prints_its_rows_and_writes_nothing_without_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    written = real_hybrid.RESULTS / "real_hybrid.md"
    before = written.stat().st_mtime_ns if written.exists() else None
    argv = ["--clips", "vtest", "--frames", "12", "--only", "edge only,hybrid 2 f/s"]
    assert real_hybrid.main(argv) == 0
    table = capsys.readouterr().out
    assert "| edge only |" in table and "hybrid 2 f/s" in table and "| cloud only |" not in table
    assert (written.stat().st_mtime_ns if written.exists() else None) == before


def test_only_with_an_unknown_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        real_hybrid.main(["--only", "nope"])
    assert exit_info.value.code == 2
    assert "no variant is named 'nope'" in capsys.readouterr().err


def test_a_missing_or_invalid_cloud_config_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  runtime: 3\n")
    for path, expected in ((tmp_path / "none.yaml", "No such file"), (bad, "bad.yaml:2")):
        with pytest.raises(SystemExit) as exited:
            real_hybrid.main(["--cloud-config", str(path), "--only", "edge only"])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "--cloud-config" in err and expected in err
        assert "Traceback" not in err
