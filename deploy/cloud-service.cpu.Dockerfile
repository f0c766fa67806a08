# Cloud service, CPU image: ONNX Runtime + CPU JPEG codec. Build from the repository root:
#   docker build -f deploy/cloud-service.cpu.Dockerfile -t cloud-service:cpu .
#   docker run -p 50051:50051 -p 9109:9109 -v $PWD/models:/models:ro \
#       -v $PWD/configs:/etc/cloud-service:ro cloud-service:cpu \
#       serve --config /etc/cloud-service/cloud-service.cpu.yaml
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY detection detection
COPY cloud_service cloud_service
COPY configkit configkit
COPY protos protos
COPY edge_agent edge_agent
COPY testbed testbed
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[cloud]"

FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1
RUN useradd --system --uid 10001 --home-dir /nonexistent cloud
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "edge-cloud-video-analytics[cloud]" \
    && rm -rf /wheels
USER cloud
EXPOSE 50051 9109
# The config's server.listen_address must be 0.0.0.0:50051 inside the container.
ENTRYPOINT ["cloud-service"]
CMD ["serve", "--config", "/etc/cloud-service/cloud-service.yaml"]
