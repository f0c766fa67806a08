// A client the project did not write: Node's @grpc/grpc-js with the service loaded from
// analytics.proto at run time (@grpc/proto-loader). It opens StreamFrames, reads the codecs the
// server announces in its initial metadata, sends the H.264 access units named on stdin (a JSON
// list of {frame_id, keyframe, sequence, session, data (base64)}, each with an optional
// after_ms to wait before writing it and deadline_ms from when it is written) as
// FrameRequest.video, and prints one JSON document: the announced codecs and every result.
//
//   node uplink_client.mjs <node_modules dir> <proto file> <proto include dir> <host:port> < units.json

import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const [modules, protoFile, includeDir, target] = process.argv.slice(2);
const require = createRequire(`${modules}/`);
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const definition = protoLoader.loadSync(protoFile, {
  keepCase: true,
  longs: Number,
  defaults: true,
  includeDirs: [includeDir],
});
const analytics = grpc.loadPackageDefinition(definition).analytics.v1;
const client = new analytics.InferenceService(target, grpc.credentials.createInsecure());
const units = JSON.parse(readFileSync(0, "utf8"));

const call = client.StreamFrames();
let codecs = null;
const results = [];
call.on("metadata", (metadata) => {
  codecs = metadata.get("analytics-uplink-codecs").map(String);
});
call.on("data", (result) => {
  results.push({
    frame_id: Number(result.frame_id),
    code: result.status ? result.status.code : 0,
    message: result.status ? result.status.message : "",
    keyframe_required: Boolean(result.keyframe_required),
    detections: result.detections.length,
  });
  if (results.length === units.length) call.end();
});
call.on("error", (error) => {
  console.error(`stream failed: ${error.code} ${error.details}`);
  process.exit(2);
});
call.on("end", () => {
  console.log(JSON.stringify({ codecs, results }));
  client.close();
});
function deadline(unit) {
  if (unit.deadline_ms === undefined) return undefined;
  const at = Date.now() + unit.deadline_ms;
  return { seconds: Math.floor(at / 1000), nanos: (at % 1000) * 1e6 };
}

for (const unit of units) {
  if (unit.after_ms) await new Promise((resolve) => setTimeout(resolve, unit.after_ms));
  call.write({
    deadline: deadline(unit),
    agent_id: "node-agent",
    camera_id: "node-cam",
    frame_id: unit.frame_id,
    request_id: `node-${unit.frame_id}`,
    original_width: unit.width,
    original_height: unit.height,
    video: {
      codec: "h264",
      data: Buffer.from(unit.data, "base64"),
      keyframe: unit.keyframe,
      session: unit.session,
      sequence: unit.sequence,
      width: unit.width,
      height: unit.height,
    },
  });
}
