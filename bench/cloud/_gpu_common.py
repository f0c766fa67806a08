"""What `bench.cloud.gpu_cloud` and `bench.cloud.gpu_cloud_e2e` share: where they run and the
report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    """Where the sections run: the GPU, or the CPU for `--smoke-cpu` (checks the script only)."""

    device: str = "cuda"
    half: bool = True
    yolo_scale: str = "x"

    @property
    def smoke(self) -> bool:
        """True when checking the script on the CPU."""
        return self.device == "cpu"

    def sync(self) -> None:
        """Wait for queued GPU work (nothing on the CPU)."""
        if not self.smoke:
            import torch

            torch.cuda.synchronize()


GPU = Target()
CPU_SMOKE = Target(device="cpu", half=False, yolo_scale="n")


class Report:
    """Markdown lines printed as they come and kept for the output file."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        """Print and keep one line."""
        print(text, flush=True)
        self.lines.append(text)

    def table(self, header: Sequence[str]) -> None:
        """Start a table with `header`."""
        self.line("| " + " | ".join(header) + " |")
        self.line("|" + "---|" * len(header))

    def row(self, cells: Sequence[object]) -> None:
        """One table row."""
        self.line("| " + " | ".join(str(c) for c in cells) + " |")

    def write(self, folder: Path) -> Path:
        """Write everything to `folder/gpu_cloud.md`."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "gpu_cloud.md"
        path.write_text("\n".join(self.lines) + "\n")
        return path
