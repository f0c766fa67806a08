"""Errors raised by the detection core, each naming what was expected and what was found."""


class DetectionError(Exception):
    """Base class for every error the detection core raises."""


class InvalidDetectionsError(DetectionError, ValueError):
    """Arrays handed to `Detections` have the wrong shape, dtype or values."""


class UnknownOutputLayoutError(DetectionError, ValueError):
    """A model output whose shape matches no supported YOLO layout."""


class ModelLoadError(DetectionError):
    """A model file (or a delegate / engine it needs) could not be loaded."""


class RuntimeUnavailableError(DetectionError):
    """The runtime named in config is not installed on this machine."""


class ModelConfigError(DetectionError, ValueError):
    """The detector config does not fit the loaded model (input size, class names, metadata)."""


class InferenceUnavailableError(DetectionError):
    """A remote inference server could not answer now (down, timing out, model not loaded).

    The frames of that call can be retried later; the cloud service answers them UNAVAILABLE.
    """


class ExportError(DetectionError):
    """A model could not be built, exported, quantised or converted (`detection.toolchain`)."""
