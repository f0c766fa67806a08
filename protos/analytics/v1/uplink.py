"""Names of the video uplink's negotiation that both sides share (see `analytics.proto`)."""

UPLINK_CODECS_METADATA_KEY = "analytics-uplink-codecs"
"""StreamFrames initial-metadata key: the comma-separated `VideoPacket.codec` values a server
decodes. Absent: the server takes JPEG only."""
