"""DeepSORT's constant-velocity Kalman filter in `(cx, cy, aspect, h)` space.

The state is `(cx, cy, a, h, vcx, vcy, va, vh)`; process and measurement noise scale with the
box height, so the filter behaves the same for near and far objects.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

#: 0.95 quantile of the chi-square distribution with N degrees of freedom (N = 1..9), the
#: gate on the squared Mahalanobis distance used by DeepSORT.
CHI2INV95: dict[int, float] = {
    1: 3.8415,
    2: 5.9915,
    3: 7.8147,
    4: 9.4877,
    5: 11.070,
    6: 12.592,
    7: 14.067,
    8: 15.507,
    9: 16.919,
}

_NDIM = 4


def xyxy_to_xyah(xyxy: npt.ArrayLike) -> FloatArray:
    """Boxes `(n, 4)` or `(4,)` in xyxy to `(cx, cy, w / h, h)`."""
    b = np.asarray(xyxy, dtype=np.float64)
    w = b[..., 2] - b[..., 0]
    h = b[..., 3] - b[..., 1]
    safe_h = np.maximum(h, 1e-6)
    return np.stack(
        [(b[..., 0] + b[..., 2]) / 2, (b[..., 1] + b[..., 3]) / 2, w / safe_h, h], axis=-1
    )


def xyah_to_xyxy(xyah: npt.ArrayLike) -> FloatArray:
    """Boxes in `(cx, cy, w / h, h)` back to xyxy."""
    b = np.asarray(xyah, dtype=np.float64)
    h = b[..., 3]
    w = b[..., 2] * h
    return np.stack(
        [b[..., 0] - w / 2, b[..., 1] - h / 2, b[..., 0] + w / 2, b[..., 1] + h / 2], axis=-1
    )


class KalmanFilter:
    """Constant-velocity Kalman filter for image boxes (Wojke et al., DeepSORT)."""

    def __init__(
        self, std_weight_position: float = 1.0 / 20, std_weight_velocity: float = 1.0 / 160
    ) -> None:
        for name, value in (
            ("std_weight_position", std_weight_position),
            ("std_weight_velocity", std_weight_velocity),
        ):
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be in (0, inf), got {value}")
        self._motion = np.eye(2 * _NDIM)
        for i in range(_NDIM):
            self._motion[i, _NDIM + i] = 1.0
        self._update = np.eye(_NDIM, 2 * _NDIM)
        self._std_pos = std_weight_position
        self._std_vel = std_weight_velocity

    def initiate(self, measurement: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """Mean `(8,)` and covariance `(8, 8)` of a new track from one `(cx, cy, a, h)` box."""
        z = np.asarray(measurement, dtype=np.float64).reshape(_NDIM)
        mean = np.concatenate([z, np.zeros(_NDIM)])
        h = z[3]
        std = np.array(
            [
                2 * self._std_pos * h,
                2 * self._std_pos * h,
                1e-2,
                2 * self._std_pos * h,
                10 * self._std_vel * h,
                10 * self._std_vel * h,
                1e-5,
                10 * self._std_vel * h,
            ]
        )
        return mean, np.diag(np.square(std))

    def predict(self, mean: FloatArray, covariance: FloatArray) -> tuple[FloatArray, FloatArray]:
        """One time step ahead; returns new arrays, the inputs are left unchanged."""
        h = mean[3]
        std = np.array(
            [
                self._std_pos * h,
                self._std_pos * h,
                1e-2,
                self._std_pos * h,
                self._std_vel * h,
                self._std_vel * h,
                1e-5,
                self._std_vel * h,
            ]
        )
        new_mean = self._motion @ mean
        new_cov = self._motion @ covariance @ self._motion.T + np.diag(np.square(std))
        return new_mean, new_cov

    def project(self, mean: FloatArray, covariance: FloatArray) -> tuple[FloatArray, FloatArray]:
        """The state distribution projected to measurement space: mean `(4,)`, cov `(4, 4)`."""
        h = mean[3]
        std = np.array([self._std_pos * h, self._std_pos * h, 1e-1, self._std_pos * h])
        proj_mean = self._update @ mean
        proj_cov = self._update @ covariance @ self._update.T + np.diag(np.square(std))
        return proj_mean, proj_cov

    def update(
        self, mean: FloatArray, covariance: FloatArray, measurement: npt.ArrayLike
    ) -> tuple[FloatArray, FloatArray]:
        """Correct the state with one `(cx, cy, a, h)` measurement; returns new arrays."""
        z = np.asarray(measurement, dtype=np.float64).reshape(_NDIM)
        proj_mean, proj_cov = self.project(mean, covariance)
        # gain = P H^T S^-1, solved rather than inverted (S is symmetric positive definite).
        gain = np.linalg.solve(proj_cov, (covariance @ self._update.T).T).T
        innovation = z - proj_mean
        new_mean = mean + innovation @ gain.T
        new_cov = covariance - gain @ proj_cov @ gain.T
        return np.asarray(new_mean, dtype=np.float64), np.asarray(new_cov, dtype=np.float64)

    def gating_distance(
        self,
        mean: FloatArray,
        covariance: FloatArray,
        measurements: npt.ArrayLike,
        only_position: bool = False,
    ) -> FloatArray:
        """Squared Mahalanobis distance `(m,)` from the state to each `(cx, cy, a, h)` row.

        Compare with `CHI2INV95[4]` (or `CHI2INV95[2]` when `only_position`).
        """
        z = np.asarray(measurements, dtype=np.float64).reshape(-1, _NDIM)
        proj_mean, proj_cov = self.project(mean, covariance)
        if only_position:
            proj_mean, proj_cov, z = proj_mean[:2], proj_cov[:2, :2], z[:, :2]
        chol = np.linalg.cholesky(proj_cov)
        d = z - proj_mean
        solved = np.linalg.solve(chol, d.T)
        return np.asarray(np.sum(solved * solved, axis=0), dtype=np.float64)
