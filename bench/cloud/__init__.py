"""Cloud-service benches: batching, slicing, JPEG decoders, Triton, the GPU sections and the fleet's
load through the balancer."""
