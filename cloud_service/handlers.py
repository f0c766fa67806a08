"""The inference service's gRPC method handlers, with a request decoder that never throws.

The generated `add_InferenceServiceServicer_to_server` decodes requests with
`FrameRequest.FromString`: bytes that are not a `FrameRequest` make grpc answer INTERNAL
("Exception deserializing request!") and log a traceback per request. Here a request that does
not decode becomes a `MalformedRequest`, which the servicer answers INVALID_ARGUMENT (unary) or
with a per-frame INVALID_ARGUMENT result (streams, which go on), and logs in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from protos.analytics.v1 import analytics_pb2 as pb

SERVICE = "analytics.v1.InferenceService"


@dataclass(frozen=True)
class MalformedRequest:
    """Request bytes that are not a `FrameRequest`."""

    size: int
    error: str

    @property
    def message(self) -> str:
        """What the client is told."""
        return f"malformed FrameRequest ({self.size} bytes): {self.error or 'cannot parse'}"


def decode_frame_request(data: bytes) -> pb.FrameRequest | MalformedRequest:
    """`FrameRequest.FromString`, or a `MalformedRequest` instead of an exception."""
    try:
        return pb.FrameRequest.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        return MalformedRequest(len(data), str(exc))


def add_inference_service(servicer: Any, server: grpc.Server) -> None:
    """Register `servicer`'s `StreamFrames` and `DetectFrame` on `server`."""
    handlers = {
        "StreamFrames": grpc.stream_stream_rpc_method_handler(
            servicer.StreamFrames,
            request_deserializer=decode_frame_request,
            response_serializer=pb.FrameResult.SerializeToString,
        ),
        "DetectFrame": grpc.unary_unary_rpc_method_handler(
            servicer.DetectFrame,
            request_deserializer=decode_frame_request,
            response_serializer=pb.FrameResult.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
