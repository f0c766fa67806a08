"""Model benches: accuracy and latency of the edge and cloud models, the YOLOv5
reference, distillation and scores on real footage against the hand-verified truth."""
