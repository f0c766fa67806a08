"""Per-layer INT8 sensitivity search: which blocks to keep in float so INT8 stays near FP32.

Post-training INT8 quantises every block of the network the same way, but blocks do not suffer
alike: a few (often the first convolution, the widest concatenations, the detection head) carry
most of the accuracy loss. The search measures that per block and keeps the fewest in float:

1. quantise the whole network (head decoding in float, as `quantize` does) and score it;
2. for each block (`Conv_0`, `C3_2`, ..., `SPPF_9`, each scale of the head), quantise everything
   but that block and score it: the block's sensitivity is the score it gives back;
3. keep blocks in float, most sensitive first, until the score is within `max_drop` of FP32 or
   `max_float_blocks` are float; each step is quantised and scored again (sensitivities do not
   add up exactly).

Blocks are found in the float model's tensor names (litert-torch names each tensor after the
module path ultralytics builds, e.g. `.../DetectionModel_model/...block.C3_4/...`). `score` is any
function of a `.tflite` path (the toolchain passes mAP50-95 on a validation set).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from detection.errors import ExportError
from detection.toolchain.quantize import FLOAT_HEAD_PATTERNS, quantize_int8

logger = logging.getLogger(__name__)

_BLOCK = re.compile(
    r"DetectionModel_model/ultralytics\.nn\.modules\.\w+\.(?P<block>[A-Za-z0-9]+_\d+)/"
    r"(?:torch\.nn\.modules\.container\.(?P<scale>Sequential_\d+)/)?"
)
_HEAD = "Detect_"


def tensor_names(model: Path) -> list[str]:
    """Every tensor name of a `.tflite` model."""
    from ai_edge_litert.interpreter import Interpreter

    return [str(t["name"]) for t in Interpreter(model_path=str(model)).get_tensor_details()]


def blocks_of(names: Sequence[str]) -> list[str]:
    """The blocks in `names`, in network order: `Conv_0`, ..., and `Detect_24/Sequential_0`
    for each scale of the head."""
    found: dict[str, int] = {}
    for name in names:
        for match in _BLOCK.finditer(name):
            block, scale = match.group("block"), match.group("scale")
            if block.startswith(_HEAD):
                if scale is None:
                    continue  # the head's decoding: float already
                block = f"{block}/{scale}"
            index = int(match.group("block").rsplit("_", 1)[1])
            found.setdefault(block, index)
    if not found:
        raise ExportError("no ultralytics blocks found in the model's tensor names")
    return sorted(found, key=lambda b: (found[b], b))


def block_pattern(block: str) -> str:
    """The regex (ai-edge-quantizer matches it against tensor names) of one block's tensors."""
    if "/" in block:
        head, scale = block.split("/")
        return rf".*\.{re.escape(head)}/torch\.nn\.modules\.container\.{re.escape(scale)}/.*"
    return rf".*DetectionModel_model/ultralytics\.nn\.modules\.\w+\.{re.escape(block)}/.*"


@dataclass(frozen=True)
class Step:
    """One quantised variant: which blocks stayed float and its score."""

    float_blocks: tuple[str, ...]
    score: float
    path: Path


@dataclass
class SearchResult:
    """The per-block sensitivities and the greedy steps, best last."""

    fp32_score: float
    all_int8: Step
    sensitivity: dict[str, float] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)

    @property
    def chosen(self) -> Step:
        """The best-scoring variant (the one with fewer float blocks on a tie)."""
        return max((self.all_int8, *self.steps), key=lambda s: (s.score, -len(s.float_blocks)))


def search(
    float_model: Path,
    calibration: Sequence[Path],
    input_size: tuple[int, int],
    score: Callable[[Path], float],
    fp32_score: float,
    work: Path,
    *,
    max_drop: float = 0.015,
    max_float_blocks: int = 4,
    blocks: Sequence[str] | None = None,
) -> SearchResult:
    """Run the search of the module docstring; the chosen model is `result.chosen.path`."""
    work.mkdir(parents=True, exist_ok=True)
    candidates = list(blocks) if blocks is not None else blocks_of(tensor_names(float_model))

    def variant(float_blocks: Sequence[str], name: str) -> Step:
        patterns = (*FLOAT_HEAD_PATTERNS, *(block_pattern(b) for b in float_blocks))
        path = quantize_int8(
            float_model, work / f"{name}.tflite", calibration, input_size, patterns
        )
        value = score(path)
        logger.info("INT8 with %s float: %.4f", list(float_blocks) or "nothing", value)
        return Step(tuple(float_blocks), value, path)

    result = SearchResult(fp32_score, variant((), "int8"))
    for block in candidates:
        alone = variant((block,), f"float-{block.replace('/', '-')}")
        result.sensitivity[block] = alone.score - result.all_int8.score
    ranked = sorted(candidates, key=lambda b: -result.sensitivity[b])
    kept: list[str] = []
    for block in ranked[:max_float_blocks]:
        if fp32_score - result.chosen.score <= max_drop or result.sensitivity[block] <= 0:
            break  # close enough, or nothing left that gives accuracy back
        kept.append(block)
        result.steps.append(variant(kept, f"mixed-{len(kept)}"))
    return result
