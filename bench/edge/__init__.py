"""Edge-agent benches: the frame loop, tracker, peer trackers, the edge model's pruning, INT8
and letterbox, snapshots, slow boxes, soak, reload, frame drops and the web UI under abuse."""
