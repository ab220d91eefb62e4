// RingJoin: the one place that defines the control messages of the ring membership protocol
// (docs/PROTOCOL.md "Ring membership"), with one encode and one validating decode per message.
// Both are kind kCollective, tag "ring:<ring id>", step 0, microbatch 0, JSON in `text`:
//   join request  {"type":"join","life":L}, no tensors: a joining node asks a ring member to admit
//                 it; L, a random number of the joiner's process (RingContext::life), is what a
//                 closed answer names (older senders omit it: 0)
//   closed        {"type":"closed","life":L}, no tensors: the sender finished its run and will not
//                 admit the request of life L
//   welcome       {"type":"welcome","generation":g,"view":[names],"step":s,"transactions":S,
//                 "checksum":h} and the ring's tensors (value.<i>, previous.<i>, momentum.<i>):
//                 the lowest-ranked member of the view admits a joiner
// Decoding parses the JSON with nlohmann_json and checks every field (kind, tag, step, microbatch,
// the JSON's type and each key's type, generation ≥ 1, a view of distinct non-empty names); a
// malformed message yields nullopt and a reason, never an exception. Whether the names are ring
// members and the tensors fit the stage's buckets is the ring's business (RingMembership).
//
// Ownership: plain values (a welcome's tensors are shared with the message). Thread-safety: pure
// functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "node/transport/WireCodec.h"

namespace cairn {

constexpr const char* kRingControlTagPrefix = "ring:";
// "ring:" + ring id: the tag of a ring's join requests and welcomes.
std::string ringControlTag(const std::string& ring_id);

struct JoinRequest {
  std::string sender;
  std::string ring_id;
  uint64_t life = 0;  // the joiner's RingContext::life (0: not given)
};

// The answer of a member that finished its run to a joiner it did not admit.
struct Closed {
  std::string sender;
  std::string ring_id;
  uint64_t life = 0;  // the life of the join request it answers (never 0)
};

struct Welcome {
  std::string sender;
  std::string ring_id;
  int64_t generation = 0;         // the generation the joiner enters (≥ 1)
  std::vector<std::string> view;  // the members of that generation (the joiner among them)
  int64_t step = 0;               // the sender's optimizer steps at the admitting sync
  int64_t transactions = 0;       // the ring's committed transactions
  uint64_t checksum = 0;          // FNV-1a of the ring's tensors as sent (RingBuckets::checksum)
  std::vector<NamedTensor> tensors;
};

Message encode(const JoinRequest& request);
Message encode(const Welcome& welcome);
Message encode(const Closed& closed);

// Whether `m` claims to be a welcome (its JSON's "type" is "welcome"); anything else on a ring's
// tag goes to decodeJoinRequest, which rejects what is not a valid join request.
bool isWelcome(const Message& m);
// Whether `m` claims to be a closed answer (its JSON's "type" is "closed"; decodeClosed checks it).
bool isClosed(const Message& m);
// The message `m` holds, or nullopt with the reason in `*why` (when not null).
std::optional<JoinRequest> decodeJoinRequest(const Message& m, std::string* why);
std::optional<Welcome> decodeWelcome(const Message& m, std::string* why);
std::optional<Closed> decodeClosed(const Message& m, std::string* why);

}  // namespace cairn
