// What the link tests (ReversedLinkTest.cpp, TurnedLinkTest.cpp) send and where they listen: a
// control message named by its tag, and a loopback endpoint whose port's successor is free too.
#pragma once

#include <string>

#include "node/transport/WireCodec.h"
#include "tests/common/LoopbackPorts.h"

namespace cairn::testutil {

// A loopback endpoint whose port + 1 (a reachable node's accept endpoint, ReversedLinks.h) is free
// too: freeLoopbackPorts keeps the port above each it hands out.
inline std::string linkTestEndpoint() {
  return "tcp://127.0.0.1:" + std::to_string(freeLoopbackPorts(1).at(0));
}

// A control message from `sender`, told apart from others by `tag`.
inline Message linkTestMessage(const std::string& sender, const std::string& tag) {
  Message m;
  m.kind = MessageKind::kControl;
  m.sender = sender;
  m.tag = tag;
  return m;
}

}  // namespace cairn::testutil
