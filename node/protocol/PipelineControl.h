// PipelineControl: the one place that defines the control messages pipeline neighbours exchange
// besides their tensors (docs/PROTOCOL.md "Pipeline control messages"), with one encode and one
// validating decode per message. All are kind kControl, told apart by their tag, with a small JSON
// object in `text`:
//   hello       {"stage": int, "cluster": int,    the handshake, and a restarted neighbour's return;
//                "run": hex, "handshake": int,   `run` (a link's random id, new with every
//                "heard_run": hex,               transport) and `handshake` (its count of
//                "heard_handshake": int}         handshakes) name this hello, `heard_*` the newest
//                                                hello the sender took from the receiver (all four
//                                                optional: an older node's hello has none)
//   leaving     {"reason": str, "lost": str}     the sender stops ("stopped", "paused", "failed",
//                                                …); `lost` names the node lost in the first place
//                                                when a pause spreads along the pipeline
//   ckpt_steps  {"steps": [int, …]}              resume agreement, Leaf → Root: the checkpoint
//                                                steps the sender and everything downstream hold
//   resume_at   {"step": int}                    resume agreement, Root → Leaf: the step to resume
//                                                from (-1: none, start afresh)
// Decoding checks the kind, the tag, that `text` is a JSON object, and every field's type and
// range; strings are cut to a bounded length. Whether the sender is a neighbour and runs the same
// job is the link's business (MailboxStageLink).
//
// Ownership: plain values. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "node/transport/WireCodec.h"

namespace cairn {

constexpr const char* kHelloTag = "hello";
constexpr const char* kLeavingTag = "leaving";
constexpr const char* kCheckpointStepsTag = "ckpt_steps";
constexpr const char* kResumeAtTag = "resume_at";
constexpr size_t kMaxCheckpointSteps = 100000;  // in one ckpt_steps message

// Who sends a message, and for which job: the header fields every control message carries.
struct ControlOrigin {
  std::string job_id;
  std::string sender;
};

// Which hello: a link's run (16 lowercase hex digits, random, new with every transport, so a
// restarted process has a new one) and its handshake count (from 1). Unknown (run empty) in an
// older node's hello.
struct HelloId {
  std::string run;
  int64_t handshake = 0;
  bool known() const { return !run.empty(); }
  bool operator==(const HelloId& o) const { return run == o.run && handshake == o.handshake; }
};
struct Hello {
  int64_t stage = 0;
  int64_t cluster = 0;
  HelloId id;     // this hello
  HelloId heard;  // the newest hello the sender took from the receiver (unknown: none)
};
constexpr size_t kMaxHelloRunChars = 32;
struct Leaving {
  std::string reason;  // at most 64 bytes kept
  std::string lost;    // at most 256 bytes kept; empty: not a spreading pause
};
struct CheckpointSteps {
  std::vector<int64_t> steps;  // each ≥ 0, at most kMaxCheckpointSteps
};
struct ResumeAt {
  int64_t step = -1;
};

Message encode(const ControlOrigin& from, const Hello& hello);
Message encode(const ControlOrigin& from, const Leaving& leaving);
Message encode(const ControlOrigin& from, const CheckpointSteps& steps);
Message encode(const ControlOrigin& from, const ResumeAt& resume);

// True when `m` claims to be the control message `tag` (kind and tag only, no validation).
bool isControl(const Message& m, const char* tag);

// The message `m` holds, or nullopt with the reason in `*why` (when not null).
std::optional<Hello> decodeHello(const Message& m, std::string* why);
std::optional<Leaving> decodeLeaving(const Message& m, std::string* why);
std::optional<CheckpointSteps> decodeCheckpointSteps(const Message& m, std::string* why);
std::optional<ResumeAt> decodeResumeAt(const Message& m, std::string* why);

}  // namespace cairn
