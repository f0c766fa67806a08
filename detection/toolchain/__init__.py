"""Model toolchain: build YOLO models and export them to ONNX and INT8 TFLite (`tools` extra)."""

from detection.errors import ExportError
from detection.toolchain.export import build_model, export_onnx, export_tflite_int8

__all__ = ["ExportError", "build_model", "export_onnx", "export_tflite_int8"]
