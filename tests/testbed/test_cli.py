"""`python -m testbed clip`: real clips fetched and their cached paths printed, one per line."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cli import main
from tests.fixtures.rtsp import MEDIA_CACHE_DIR


def test_clip_prints_cached_paths(capsys: pytest.CaptureFixture[str], sample_clip: Path) -> None:
    code = main(["clip", "bikes", "--cache-dir", str(MEDIA_CACHE_DIR), "--log-level", "WARNING"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out == [str(sample_clip)]
    code = main(["clip", "bikes", "--source", "--cache-dir", str(MEDIA_CACHE_DIR)])
    source = Path(capsys.readouterr().out.strip())
    assert code == 0 and source.name == "bikes.mp4" and source.is_file()


def test_clip_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clip", "bikes", "no-such-clip"]) == 2
    assert "unknown clip 'no-such-clip'" in capsys.readouterr().err
