// SubProtocols: the table of the sub-protocols that share the wire (docs/PROTOCOL.md
// "Sub-protocols", same order): for each, its name, message kind, how a receiver recognises its
// messages (tag, reserved microbatch value, JSON type), the header that defines its messages
// (one encode and one validating decode per message), and what it is for. Adding a sub-protocol
// is one new file under node/protocol/ and one line in this table (SubProtocols.cpp).
//
// Ownership: static data. Thread-safety: read-only, any thread.
#pragma once

#include <optional>
#include <vector>

#include "node/transport/WireCodec.h"

namespace cairn {

struct SubProtocol {
  const char* name;
  // The wire message kind; nullopt for a protocol on its own connection, not on the pipeline
  // wire (coordination).
  std::optional<MessageKind> kind;
  const char* recognised_by;  // tag (prefix), reserved microbatch value, JSON "type"
  const char* header;         // where its messages are defined
  const char* description;    // one line
};

// Every sub-protocol, in the order of docs/PROTOCOL.md.
const std::vector<SubProtocol>& subProtocols();

}  // namespace cairn
