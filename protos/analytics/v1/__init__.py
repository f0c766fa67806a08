"""analytics.v1: the edge-to-cloud inference contract (`analytics.proto`)."""
