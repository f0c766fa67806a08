"""nvImageCodec (`nvidia.nvimgcodec`) batched JPEG decode: the hardware JPEG engine, NVJPEG on
CUDA or the hybrid decoder; imported lazily, `RuntimeUnavailableError` where it is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from cloud_service.decoders.base import DecodeError, DecodeResult, JpegLimits
from cloud_service.decoders.headers import JpegInfo, check_all
from cloud_service.decoders.nvjpeg import BatchedGpuDecoder, DeviceImage, import_torch
from detection.errors import RuntimeUnavailableError

logger = logging.getLogger(__name__)


def _probe_jpeg() -> bytes:
    import cv2

    ok, encoded = cv2.imencode(".jpg", np.full((16, 16, 3), 128, np.uint8))
    if not ok:
        raise RuntimeError("cv2.imencode failed on a 16x16 image")
    return bytes(encoded)


GPU_BACKENDS = ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU")


class NvImageCodecDecoder(BatchedGpuDecoder):
    """nvImageCodec (`nvidia.nvimgcodec`) batched decode on one GPU, GPU backends only.

    `backend_kinds` are `BackendKind` names: the hardware JPEG engine (A100, H100, H200), the
    CUDA decoder and the hybrid one by default; `("CPU_ONLY",)` with `device_id=-1` decodes on
    the CPU (tests). nvImageCodec returns None for a payload it cannot decode and decodes the
    rest. The constructor decodes a tiny image, so a missing GPU fails at start-up.
    """

    def __init__(
        self,
        *,
        limits: JpegLimits | None = None,
        device_id: int = 0,
        threads: int = 4,
        backend_kinds: Sequence[str] = GPU_BACKENDS,
    ) -> None:
        try:
            from nvidia import nvimgcodec
        except ImportError as exc:
            raise RuntimeUnavailableError(
                "nvImageCodec is not installed (nvidia-nvimgcodec-cu12/cu13, `gpu` extra)"
            ) from exc
        super().__init__(limits)
        on_cpu = tuple(backend_kinds) == ("CPU_ONLY",)
        self.name = "nvimgcodec/cpu" if on_cpu else "nvjpeg/nvimgcodec"
        self._nvimgcodec = nvimgcodec
        kinds = [getattr(nvimgcodec.BackendKind, k) for k in backend_kinds]
        device = nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY if on_cpu else device_id
        try:
            self._decoder = nvimgcodec.Decoder(
                device_id=device,
                max_num_cpu_threads=threads,
                backends=[nvimgcodec.Backend(kind) for kind in kinds],
            )
        except Exception as exc:  # nvImageCodec raises its own pybind types
            raise RuntimeUnavailableError(f"nvImageCodec cannot start: {exc}") from exc
        # sRGB is `RGB` before nvImageCodec 0.6. EXIF orientation is ignored like the CPU codecs
        # do, so the decoded size matches the SOF header.
        srgb = getattr(nvimgcodec.ColorSpec, "SRGB", None) or nvimgcodec.ColorSpec.RGB
        self._params = nvimgcodec.DecodeParams(
            apply_exif_orientation=False, color_spec=srgb, allow_any_depth=False
        )
        self._host_kind = nvimgcodec.ImageBufferKind.STRIDED_HOST
        probe = self._decode_images([_probe_jpeg()])[0]
        if isinstance(probe, DecodeError):
            where = "the CPU" if on_cpu else f"GPU {device_id}"
            raise RuntimeUnavailableError(f"no CUDA GPU: nvImageCodec cannot decode on {where}")

    def _decode_images(self, payloads: list[bytes]) -> list[Any | DecodeError]:
        """nvImageCodec images (HWC RGB, device memory) or errors."""
        streams: list[Any] = []
        results: list[Any | DecodeError] = []
        for data in payloads:
            try:
                streams.append(self._nvimgcodec.CodeStream(data))
                results.append(None)
            except Exception as exc:  # a stream that does not parse
                results.append(DecodeError(f"cannot decode JPEG: {exc}"))
        slots = [i for i, r in enumerate(results) if r is None]
        if not slots:
            return results
        try:
            images = list(self._decoder.decode(streams, params=self._params))
        except Exception as exc:
            logger.debug("nvImageCodec batch failed (%s); one by one", exc)
            images = [self._decode_alone(stream) for stream in streams]
        for i, image in zip(slots, images, strict=True):
            failed = image is None or isinstance(image, DecodeError)
            results[i] = image if not failed else DecodeError("cannot decode JPEG: nvImageCodec")
        return results

    def _decode_alone(self, stream: Any) -> Any:
        try:
            return self._decoder.decode(stream, params=self._params)
        except Exception:
            return None

    def _decode_valid(self, payloads: list[bytes]) -> list[DeviceImage | DecodeError]:
        torch = import_torch()
        return [
            image if isinstance(image, DecodeError) else self._to_tensor(torch, image)
            for image in self._decode_images(payloads)
        ]

    def _to_tensor(self, torch: Any, image: Any) -> DeviceImage:
        """HWC nvImageCodec image -> CHW torch tensor, zero-copy (DLPack) in device memory."""
        if image.buffer_kind == self._host_kind:  # the CPU backend
            return torch.from_numpy(np.asarray(image)).permute(2, 0, 1)
        return torch.from_dlpack(image).permute(2, 0, 1)

    def decode_batch(self, payloads: Sequence[bytes]) -> list[DecodeResult]:
        """Decode on the GPU and copy to host BGR arrays (no torch needed)."""
        checked = check_all(payloads, self.limits)
        results: list[DecodeResult] = [
            info if isinstance(info, DecodeError) else DecodeError("not decoded")
            for info in checked
        ]
        valid = [(i, info) for i, info in enumerate(checked) if isinstance(info, JpegInfo)]
        images = self._decode_images([payloads[i] for i, _ in valid]) if valid else []
        for (i, info), image in zip(valid, images, strict=True):
            if isinstance(image, DecodeError):
                results[i] = image
                continue
            host = np.ascontiguousarray(np.asarray(image.cpu())[:, :, ::-1], dtype=np.uint8)
            shape_ok = host.shape == (info.height, info.width, 3)
            results[i] = (
                host
                if shape_ok
                else DecodeError(
                    f"decoded shape {host.shape} differs from header size "
                    f"{info.width}x{info.height}"
                )
            )
        return results
