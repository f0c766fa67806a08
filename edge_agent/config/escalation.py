"""`escalation:` — which frames go to the cloud detector, within what budget, and how."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from configkit.base import StrictModel
from configkit.common import HOST_PORT_PATTERN
from configkit.secrets import SecretRef
from configkit.yaml_loader import config_error_at


class EscalationConfig(StrictModel):
    """Sending hard frames to the cloud service; the edge never waits for the answers."""

    enabled: bool = Field(default=False, description="Escalate hard frames to the cloud.")
    cloud_address: str | None = Field(
        default=None,
        pattern=HOST_PORT_PATTERN,
        description="gRPC target `host:port` of the cloud service; required when enabled.",
    )
    tls: bool = Field(default=False, description="Use TLS to the cloud service.")
    tls_ca_path: Path | None = Field(
        default=None, description="PEM CA bundle to verify the cloud with; none: system roots."
    )
    auth_token: SecretRef | None = Field(
        default=None, description="Where the bearer token sent to the cloud comes from."
    )
    per_camera_frames_per_s: float = Field(
        default=2.0, gt=0.0, le=1_000.0, description="Budget of escalated frames per camera."
    )
    per_camera_bytes_per_s: int = Field(
        default=500_000, ge=1_000, le=10**10, description="Budget of JPEG bytes per camera."
    )
    per_agent_frames_per_s: float = Field(
        default=10.0, gt=0.0, le=10_000.0, description="Budget of escalated frames, all cameras."
    )
    per_agent_bytes_per_s: int = Field(
        default=4_000_000, ge=1_000, le=10**11, description="Budget of JPEG bytes, all cameras."
    )
    uncertain_confidence_low: float = Field(
        default=0.25, ge=0.0, le=1.0, description="Lower end of the uncertain confidence band."
    )
    uncertain_confidence_high: float = Field(
        default=0.6, ge=0.0, le=1.0, description="Upper end of the uncertain confidence band."
    )
    jpeg_quality: int = Field(default=85, ge=1, le=100, description="JPEG quality of sent frames.")
    deadline_ms: int = Field(
        default=500, ge=10, le=60_000, description="Deadline of one frame at the cloud."
    )
    max_in_flight: int = Field(
        default=8, ge=1, le=1_024, description="Frames sent and not yet answered, per agent."
    )
    refresh_interval_s: float = Field(
        default=10.0,
        ge=0.0,
        le=3_600.0,
        description="Send one frame per camera at least this often; 0 turns refreshes off.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.enabled and self.cloud_address is None:
            raise config_error_at(
                ("enabled",), "escalation is enabled but `cloud_address` is not set"
            )
        if self.tls_ca_path is not None and not self.tls:
            raise config_error_at(("tls_ca_path",), "`tls_ca_path` is set but `tls` is false")
        if self.uncertain_confidence_low >= self.uncertain_confidence_high:
            raise config_error_at(
                ("uncertain_confidence_low",),
                f"uncertain_confidence_low ({self.uncertain_confidence_low}) must be below "
                f"uncertain_confidence_high ({self.uncertain_confidence_high})",
            )
        for unit in ("frames_per_s", "bytes_per_s"):
            camera, agent = getattr(self, f"per_camera_{unit}"), getattr(self, f"per_agent_{unit}")
            if camera > agent:
                raise config_error_at(
                    (f"per_camera_{unit}",),
                    f"per_camera_{unit} ({camera}) exceeds per_agent_{unit} ({agent})",
                )
        return self
