"""Shared pytest set-up: real-component fixtures live in `tests/fixtures/` as plugins."""

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.grpc_server",
    "tests.fixtures.mqtt",
    "tests.fixtures.rtsp",
    "tests.fixtures.scenes",
    "tests.fixtures.triton",
]
