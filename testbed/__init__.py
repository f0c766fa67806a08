"""Test bed: real media, an RTSP server script and helpers shared by the real-component tests.

Importing this package pulls no heavy dependency (no torch, no OpenCV); the RTSP server script
(`testbed/rtsp_server.py`) runs under the system interpreter and is never imported from here.
"""

from testbed.media import MediaError, VideoInfo, probe_video, sample_clip, synthetic_clip

__all__ = ["MediaError", "VideoInfo", "probe_video", "sample_clip", "synthetic_clip"]
