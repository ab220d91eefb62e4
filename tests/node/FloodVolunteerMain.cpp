// flood_volunteer: a hostile member for the flood integration test (issue [Q], docs/OPERATIONS.md
// "Floods"). It joins the coordinator of `--invite` as a real volunteer would (its own CURVE key, a
// reachability responder at `--listen`, the smallest probe allowed; it joins after the run is
// planned, so it is a spare), then for `--seconds` (or until SIGTERM/SIGINT) sends everything a
// member may send, as fast as ZeroMQ takes it: joins again, heartbeats, metrics batches of
// kMaxMetricsRecords records, chunk requests for the largest piece (on a second connection, as a
// Root's fetcher does) and checkpoint uploads of `--upload-mib` MiB. Sends never block (a full
// queue skips the message). Every reply is read and counted.
// Prints one line "flood: sent N messages (B bytes); replies R; too-many T; blocked K; other
// rejections O; chunk replies P" and exits 0; 2 on bad flags or when it is not accepted.
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>

#include "core/CurveKeys.h"
#include "core/TorchCompat.h"
#include "node/protocol/ChunkMessages.h"
#include "node/protocol/Coordination.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/volunteer/ReachabilityResponder.h"

namespace {

using namespace cairn;
using Clock = std::chrono::steady_clock;

std::atomic<bool> stop_asked{false};
extern "C" void onStopSignal(int) { stop_asked = true; }

struct Tally {
  uint64_t sent = 0, bytes = 0, replies = 0, too_many = 0, blocked = 0, other = 0, chunk_replies = 0;
};

// Without blocking: a message whose first frame finds the queue full is skipped (ZeroMQ then takes
// the rest of a message whose first frame it took).
void send(zmq::socket_t& socket, const Frames& frames, Tally& tally) {
  size_t bytes = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                             : zmq::send_flags::dontwait;
    const auto sent = socket.send(zmq::buffer(frames[i]), flags);
    if (!sent) {
      if (i == 0) return;
      continue;
    }
    bytes += frames[i].size();
  }
  ++tally.sent;
  tally.bytes += bytes;
}

void drain(zmq::socket_t& socket, Tally& tally) {
  while (auto reply = recvFrames(socket, std::chrono::milliseconds(0))) {
    ++tally.replies;
    std::string why;
    const auto m = decodeToVolunteer(*reply, size_t(1) << 31, &why);
    if (m && std::holds_alternative<Rejected>(*m)) {
      const std::string& reason = std::get<Rejected>(*m).reason;
      if (reason.find("blocked for") != std::string::npos)
        ++tally.blocked;
      else if (reason.find("too many") != std::string::npos)
        ++tally.too_many;
      else
        ++tally.other;
    } else if (!m && decodeChunkReply(*reply, &why)) {
      ++tally.chunk_replies;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flood_volunteer: join a coordinator, then flood it (flood integration test helper)"};
  std::string invite_text, listen = "127.0.0.1:0";
  double seconds = 30;
  int upload_mib = 8;
  app.add_option("--invite", invite_text)->required();
  app.add_option("--listen", listen);
  app.add_option("--seconds", seconds)->check(CLI::Range(0.1, 3600.0));
  app.add_option("--upload-mib", upload_mib)->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGTERM, onStopSignal);
  std::signal(SIGINT, onStopSignal);
  try {
    const Invite invite = parseInvite(invite_text);
    zmq::context_t context;
    const CurveKeyPair own = generateCurveKeyPair();
    ReachabilityResponder responder(context, own, invite.coordinator_key, listen);
    zmq::socket_t session = coordinationClient(context, zmq::socket_type::dealer, own,
                                               invite.coordinator_key, invite.address(), size_t(1) << 31);
    JoinAsk ask;
    ask.token = invite.token;
    ask.advertise = responder.bound();
    ask.probe = {0.1, 1, 1.0, 10.0, {}, libtorchVersion()};  // near the least a probe may give
    sendFrames(session, encode(ask));
    std::string name;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (name.empty() && Clock::now() < deadline) {
      const auto reply = recvFrames(session, std::chrono::milliseconds(1000));
      if (!reply) continue;
      std::string why;
      const auto m = decodeToVolunteer(*reply, size_t(1) << 31, &why);
      if (m && std::holds_alternative<Accepted>(*m)) name = std::get<Accepted>(*m).name;
      if (m && std::holds_alternative<Rejected>(*m)) {
        std::fprintf(stderr, "flood: not accepted: %s\n", std::get<Rejected>(*m).reason.c_str());
        return 2;
      }
    }
    if (name.empty()) {
      std::fprintf(stderr, "flood: no answer to the join within 60 s\n");
      return 2;
    }
    std::printf("flood: joined as %s; flooding for %.1f s\n", name.c_str(), seconds);
    std::fflush(stdout);
    zmq::socket_t chunks = coordinationClient(context, zmq::socket_type::dealer, own,
                                              invite.coordinator_key, invite.address(), size_t(1) << 31);
    ask.name = name;
    MetricsBatch metrics{name, "flood", 0, {}, 0};
    for (size_t i = 0; i < kMaxMetricsRecords; ++i)
      metrics.records.push_back({{"type", "step"}, {"step", int64_t(i)}, {"loss", 1.0}});
    const std::string file(size_t(upload_mib) << 20, 'x');
    const CheckpointUpload upload{name, 10, 0, file};  // a wrong checksum: never stored
    Tally tally;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    for (int64_t i = 0; Clock::now() < end && !stop_asked; ++i) {
      send(session, encode(Heartbeat{name, "waiting", i}), tally);
      send(session, encode(ask), tally);
      metrics.seq = i * int64_t(kMaxMetricsRecords);
      send(session, encode(metrics), tally);
      send(chunks, encode(ChunkRequest{name, 0, 0, kMaxChunkPieceBytes}), tally);
      if (i % 32 == 0) send(session, encode(upload), tally);
      drain(session, tally);
      drain(chunks, tally);
    }
    drain(session, tally);
    drain(chunks, tally);
    std::printf("flood: sent %llu messages (%llu bytes); replies %llu; too-many %llu; blocked %llu; "
                "other rejections %llu; chunk replies %llu\n",
                (unsigned long long)tally.sent, (unsigned long long)tally.bytes,
                (unsigned long long)tally.replies, (unsigned long long)tally.too_many,
                (unsigned long long)tally.blocked, (unsigned long long)tally.other,
                (unsigned long long)tally.chunk_replies);
    session.set(zmq::sockopt::linger, 0);
    chunks.set(zmq::sockopt::linger, 0);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flood: %s\n", e.what());
    return 2;
  }
}
