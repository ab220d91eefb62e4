// cairn::Error — the one project exception type, with a kind and the source location it was
// raised at. Binaries catch it in main(), print what() on one line, and exit with exitCode().
// Thread-safety: plain value type.
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace cairn {

enum class ErrorKind {
  kBadInput,  // a file, flag or message from outside was wrong: exit code 2
  kPeerLost,  // a peer did not answer in time or went away: exit code 3
  kInternal,  // a bug or an unexpected library failure: exit code 1
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, const char* file = "", int line = 0);
  ErrorKind kind() const { return kind_; }
  // "core/NodeConfigs.cpp:42", for debug logs; never part of what().
  const std::string& where() const { return where_; }
  int exitCode() const;

 private:
  ErrorKind kind_;
  std::string where_;
};

struct BadInput : Error {
  explicit BadInput(std::string m, const char* f = "", int l = 0)
      : Error(ErrorKind::kBadInput, std::move(m), f, l) {}
};
// Why a peer counts as lost.
enum class LossCause : uint8_t {
  kSilent,        // connected, but nothing arrived (or nothing was taken) within the timeout
  kDisconnected,  // its connection has been down longer than the grace period
  kLeft,          // it said it is leaving (PeerLoss::reason says why)
  kRestarted,     // it said hello again: a new process has taken its place
  kAborted,       // another member of a collective reported it lost, or its wait timed out there
};
const char* toString(LossCause cause);  // "silent", "disconnected", "left", "restarted", "aborted"

// Who was lost and how; carried by the PeerLost that reports it.
struct PeerLoss {
  std::string peer;
  LossCause cause = LossCause::kSilent;
  std::string reason;  // with kLeft: the reason it gave ("stopped", "paused", "failed", …)
  std::string origin;  // the node lost in the first place (a pause names it as it spreads); peer
                       // when it is the one
};

// A peer did not answer in time or went away. Raised where the peer is known, it carries the
// PeerLoss (CAIRN_THROW_LOST), so that whoever catches it needs no side channel to learn who.
struct PeerLost : Error {
  explicit PeerLost(std::string m, const char* f = "", int l = 0)
      : Error(ErrorKind::kPeerLost, std::move(m), f, l) {}
  PeerLost(std::string m, PeerLoss loss, const char* f = "", int l = 0)
      : Error(ErrorKind::kPeerLost, std::move(m), f, l), loss_(std::move(loss)) {}
  // Who and how, when the thrower knew.
  const std::optional<PeerLoss>& loss() const { return loss_; }

 private:
  std::optional<PeerLoss> loss_;
};
// A wait given up because this node was asked to stop (a signal, or its node was given to
// another volunteer) and the stop has been asked for a while with the wait still going on: thrown
// by a pipeline link's waits (node/pipeline/MailboxStageLink.h) and a collective's
// (node/collectives/ProcessGroup.h ProcessGroupOptions::interrupted). Not a PeerLost: nobody is
// lost, this node leaves.
struct Interrupted : Error {
  explicit Interrupted(std::string m, const char* f = "", int l = 0)
      : Error(ErrorKind::kPeerLost, std::move(m), f, l) {}
};
struct InternalError : Error {
  explicit InternalError(std::string m, const char* f = "", int l = 0)
      : Error(ErrorKind::kInternal, std::move(m), f, l) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

// "text" (with its double quotes), for naming a value in a message.
inline std::string inQuotes(const std::string& s) { return "\"" + s + "\""; }

}  // namespace cairn

// Throw a cairn error of TYPE (BadInput, PeerLost, InternalError) with a message built from the
// streamed arguments, recording file:line.
#define CAIRN_THROW(TYPE, ...) \
  throw ::cairn::TYPE(::cairn::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// Throw a PeerLost carrying `LOSS` (a PeerLoss), with a message built from the streamed arguments.
#define CAIRN_THROW_LOST(LOSS, ...) \
  throw ::cairn::PeerLost(::cairn::detail::concat(__VA_ARGS__), LOSS, __FILE__, __LINE__)

// Internal invariants (not for user input: use BadInput with a message naming the file/key).
#define CAIRN_ENFORCE(cond, ...)                                                           \
  do {                                                                                     \
    if (!(cond)) CAIRN_THROW(InternalError, "check failed: " #cond ": ", ##__VA_ARGS__);    \
  } while (0)

// Prints both values when they differ.
#define CAIRN_ENFORCE_EQ(a, b, ...)                                                         \
  do {                                                                                      \
    const auto& cairn_a_ = (a);                                                             \
    const auto& cairn_b_ = (b);                                                             \
    if (!(cairn_a_ == cairn_b_))                                                            \
      CAIRN_THROW(InternalError, "check failed: " #a " == " #b " (", cairn_a_, " vs ",       \
                  cairn_b_, ") ", ##__VA_ARGS__);                                           \
  } while (0)
