"""Hybrid-loop benches: the edge-cloud trade-off on generated scenes and on real clips, the uplink's
cost, the scene generator and the simulation they share."""
