# Cloud service, GPU image: TensorRT 10 engines (or ONNX Runtime with the CUDA / TensorRT
# execution providers) and NVJPEG decoding through nvImageCodec. Build from the repository root:
#   docker build -f deploy/cloud-service.gpu.Dockerfile -t cloud-service:gpu .
#   docker run --gpus all -p 50051:50051 -p 9109:9109 -v $PWD/models:/models:ro \
#       -v $PWD/configs:/etc/cloud-service:ro cloud-service:gpu \
#       serve --config /etc/cloud-service/cloud-service.example.yaml
# A TensorRT engine only runs on the GPU model and TensorRT version it was built with: build it
# with this image on the target machine (writes /models/out/<name>.engine):
#   docker run --gpus all -v $PWD/models:/models --entrypoint vision-toolchain cloud-service:gpu \
#       export --source /models/yolov5x.onnx --format tensorrt --max-batch 16 --out /models/out
# The base pins CUDA 12.6, cuDNN 9 and TensorRT 10.7 (Python 3.12); nvImageCodec and
# onnxruntime-gpu below are their CUDA 12 builds. Change BASE and those together.
ARG BASE=nvcr.io/nvidia/tensorrt:24.12-py3

FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY detection detection
COPY cloud_service cloud_service
COPY configkit configkit
COPY protos protos
COPY edge_agent edge_agent
COPY testbed testbed
RUN python3 -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE}
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN useradd --system --uid 10001 --home-dir /nonexistent cloud
COPY --from=build /wheels /wheels
# `gpu` extra: TensorRT (already in the base, so pip keeps it), cuda-python, nvImageCodec.
# Not the `cloud` extra: its CPU onnxruntime must never share an environment with
# onnxruntime-gpu. simplejpeg is the CPU decoder the service falls back to.
RUN wheel="$(ls /wheels/edge_cloud_video_analytics-*.whl)" \
    && python3 -m pip install "${wheel}[gpu]" "onnxruntime-gpu>=1.20,<2" "simplejpeg>=1.7" \
    && rm -rf /wheels \
    && python3 -c "import tensorrt, onnxruntime, cloud_service.engines, cloud_service.decoders.nvjpeg; print('TensorRT', tensorrt.__version__, 'ORT', onnxruntime.get_available_providers())"
USER cloud
EXPOSE 50051 9109
# The config's server.listen_address must be 0.0.0.0:50051 inside the container.
ENTRYPOINT ["cloud-service"]
CMD ["serve", "--config", "/etc/cloud-service/cloud-service.yaml"]
