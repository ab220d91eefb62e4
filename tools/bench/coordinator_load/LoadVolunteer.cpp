#include "tools/bench/coordinator_load/LoadVolunteer.h"

#include <algorithm>
#include <random>

#include "core/Fnv.h"
#include "node/protocol/ChunkMessages.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/volunteer/VolunteerSockets.h"

namespace cairn::bench::load {
namespace {

constexpr size_t kMaxReplyBytes = size_t(64) << 20;  // an assignment's stage file fits
constexpr size_t kMaxReachBytes = 64 << 10;
constexpr size_t kMaxRecordsHeld = 20000;  // MetricsStreamOptions::capacity

size_t bytesOf(const Frames& frames) {
  size_t n = 0;
  for (const auto& f : frames) n += f.size();
  return n;
}

std::string randomStream() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const char* digits = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string s(16, '0');
  for (char& c : s) c = digits[rng() % 36];
  return s;
}

double unitRandom() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

// Drains one socket without blocking (a message of too many frames counts as dropped).
std::optional<Frames> readOne(zmq::socket_t& s) {
  return recvFrames(s, std::chrono::milliseconds(0));
}

}  // namespace

LoadVolunteer::LoadVolunteer(zmq::context_t& context, const VolunteerOptions& options,
                             LoadRecorder& recorder, Clock::time_point start_at, int listen_port)
    : context_(context),
      o_(options),
      recorder_(recorder),
      keys_(generateCurveKeyPair()),
      listen_port_(listen_port),
      start_at_(start_at),
      stream_(randomStream()) {}

LoadVolunteer::~LoadVolunteer() = default;

void LoadVolunteer::send(const Frames& frames) {
  // Never blocks: a message the socket cannot take now is lost like a dropped packet (and the
  // request it carried is sent again after its timeout).
  if (!trySendFrames(dealer_, frames)) recorder_.problem("a send was refused (queue full)");
}

void LoadVolunteer::fail(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  recorder_.problem(why);
  recorder_.progress().failed.fetch_add(1);
}

void LoadVolunteer::start(Clock::time_point now) {
  std::string bound;
  try {
    router_ = coordinationServer(context_, keys_, "127.0.0.1:" + std::to_string(listen_port_),
                                 kMaxReachBytes, &bound);
    std::string accept_bound;
    accept_router_ = coordinationServer(context_, keys_, "127.0.0.1:" + std::to_string(listen_port_ + 1),
                                        kMaxReachBytes, &accept_bound);
  } catch (const std::exception& e) {
    return fail(e.what());  // the port is taken (another program): this volunteer does not join
  }
  advertise_ = bound;
  dealer_ = volunteerSocket(context_, keys_, o_.invite, /*immediate=*/false, kMaxReplyBytes, 0);
  const Frames probe = encode(BandwidthProbeMsg{std::string(o_.probe_bytes, '\0')});
  send(probe);
  recorder_.sent(Msg::kProbe, bytesOf(probe));
  sent_probe_ = now;
  phase_ = Phase::kProbing;
}

void LoadVolunteer::readRouter() {
  for (zmq::socket_t* socket : {&router_, &accept_router_}) readReach(*socket);
}

void LoadVolunteer::readReach(zmq::socket_t& router) {
  while (router) {
    auto in = recvRouted(router, std::chrono::milliseconds(0));
    if (!in) return;
    std::string why;
    const auto m = decodeReach(in->frames, &why);
    const auto* check = m ? std::get_if<ReachCheck>(&*m) : nullptr;
    if (!check || in->user_id != "coordinator") {
      recorder_.problem("reach responder: dropped " + (why.empty() ? "a message" : why));
      continue;
    }
    sendRouted(router, in->routing_id, encode(ReachOk{check->nonce}));
  }
}

void LoadVolunteer::readDealer(Clock::time_point now) {
  while (dealer_) {
    auto frames = readOne(dealer_);
    if (!frames) return;
    recorder_.reply();
    onMessage(*frames, now);
  }
}

void LoadVolunteer::onMessage(const Frames& frames, Clock::time_point now) {
  std::string why;
  const auto m = decodeToVolunteer(frames, kMaxReplyBytes, &why);
  if (!m) {  // not a coordination reply: a chunk piece, or malformed
    std::string chunk_why;
    if (decodeChunkReply(frames, &chunk_why)) return onPiece(frames, now);
    return recorder_.problem("malformed reply: " + why);
  }
  if (const auto* ack = std::get_if<BandwidthAck>(&*m); ack && phase_ == Phase::kProbing) {
    recorder_.latency(Msg::kProbe, now - sent_probe_);
    VolunteerProbe probe;
    probe.ram_gb = 16;
    probe.cores = 4;
    probe.compute_gflops = 50;
    probe.bandwidth_mbps = double(o_.probe_bytes) * 8 / 1e6 /
                           std::max(1e-6, std::chrono::duration<double>(now - sent_probe_).count());
    probe.libtorch = o_.libtorch;
    const Frames join = encode(JoinAsk{o_.invite.token, advertise_, probe, ""});
    send(join);
    recorder_.sent(Msg::kJoin, bytesOf(join));
    sent_join_ = now;
    phase_ = Phase::kJoining;
  } else if (std::get_if<BandwidthAck>(&*m) && echo_sent_) {
    recorder_.latency(Msg::kEcho, now - *echo_sent_);
    echo_sent_.reset();
  } else if (const auto* a = std::get_if<Accepted>(&*m)) {
    if (phase_ == Phase::kJoining) {
      recorder_.latency(Msg::kJoin, now - sent_join_);
      accepted_at_ = now;
      recorder_.progress().accepted.fetch_add(1);
      phase_ = Phase::kMember;
      router_.close();  // the coordinator dials them only while admitting (header comment)
      accept_router_.close();
      next_beat_ = now;
      next_echo_ = now + std::chrono::duration_cast<Clock::duration>(o_.echo_every * unitRandom());
    }
    name_ = a->name;  // a spare may be given a lost node's name
  } else if (const auto* as = std::get_if<Assignment>(&*m)) {
    onAssignment(*as, now);
  } else if (const auto* ack = std::get_if<MetricsAck>(&*m)) {
    while (acked_ < ack->seq && !records_.empty()) {
      records_.pop_front();
      ++acked_;
    }
    if (metrics_sent_) recorder_.latency(Msg::kMetrics, now - *metrics_sent_);
    metrics_sent_.reset();
  } else if (std::get_if<CheckpointAck>(&*m)) {
    if (checkpoint_sent_) recorder_.latency(Msg::kCheckpoint, now - *checkpoint_sent_);
    checkpoint_sent_.reset();
  } else if (const auto* r = std::get_if<Rejected>(&*m)) {
    recorder_.progress().rejected.fetch_add(1);
    if (phase_ != Phase::kMember)
      fail("rejected: " + r->reason);
    else
      recorder_.problem("rejected: " + r->reason);
  }
}

void LoadVolunteer::onAssignment(const Assignment& a, Clock::time_point now) {
  if (assigned_) return;
  assigned_ = true;
  assigned_at_ = now;
  recorder_.progress().assigned.fetch_add(1);
  name_ = a.name;
  state_ = "training";
  step_ = 0;
  // Steps and metrics batches at a random point of their periods unless in lockstep (options).
  const double phase = o_.lockstep ? 1.0 : unitRandom();
  next_step_ = now + std::chrono::duration_cast<Clock::duration>(o_.step * phase);
  next_metrics_ = now + std::chrono::duration_cast<Clock::duration>(o_.metrics_interval * phase);
  // The first upload at a random point of the period: clusters do not checkpoint in lockstep.
  next_checkpoint_ =
      now + std::chrono::duration_cast<Clock::duration>(o_.checkpoint_every * unitRandom());
  next_beat_ = now;
  if (a.node.value("stage", -1) != 0) return;  // only a Root reads data
  const nlohmann::json data = a.job.value("data", nlohmann::json::object());
  if (data.value("source", "") != "coordinator") return;
  const int cluster = a.node.value("cluster", 0);
  const auto shards = data.value("shards", nlohmann::json::array());
  for (size_t p = 0; p < shards.size(); ++p)  // dealt round robin (DealSampler.h)
    if (int64_t(p) % std::max<int64_t>(1, a.num_clusters) == cluster)
      chunks_.push_back(
          {shards[p].value("chunk", int64_t(0)), shards[p].value("bytes", uint64_t(0))});
  for (const auto& t : data.value("test_shards", nlohmann::json::array()))
    chunks_.push_back({t.value("chunk", int64_t(0)), t.value("bytes", uint64_t(0))});
  next_chunks_ = now;
}

void LoadVolunteer::step(Clock::time_point now) {
  ++step_;
  next_step_ += o_.step;
  if (next_step_ < now) next_step_ = now + o_.step;
  if (records_.size() >= kMaxRecordsHeld) {  // drop-oldest, as MetricsQueue
    records_.pop_front();
    ++acked_;
  }
  records_.push_back({{"step", step_},
                      {"loss", 2.3 / double(1 + step_ % 100)},
                      {"samples", 32},
                      {"compute_s", 0.05},
                      {"sent_bytes", 100000},
                      {"lr", 0.003}});
}

void LoadVolunteer::sendMetrics(Clock::time_point now) {
  next_metrics_ = now + o_.metrics_interval;
  if (metrics_sent_) {
    if (now - *metrics_sent_ < o_.metrics_resend) return;  // one batch in flight
    recorder_.resend();
  }
  if (records_.empty()) return;
  MetricsBatch b{name_, stream_, acked_, {records_.begin(), records_.end()}, 0};
  const Frames frames = encode(b);
  send(frames);
  recorder_.sent(Msg::kMetrics, bytesOf(frames));
  metrics_sent_ = now;
}

void LoadVolunteer::sendEcho(Clock::time_point now) {
  next_echo_ = now + o_.echo_every;
  if (echo_sent_) return;  // one in flight (an unanswered one is not sent again)
  const Frames frames = encode(BandwidthProbeMsg{std::string(64, '\0')});
  send(frames);
  recorder_.sent(Msg::kEcho, bytesOf(frames));
  echo_sent_ = now;
}

void LoadVolunteer::sendCheckpoint(Clock::time_point now) {
  next_checkpoint_ = now + o_.checkpoint_every;
  if (checkpoint_sent_) {
    if (now - *checkpoint_sent_ < o_.checkpoint_resend) return;
    recorder_.resend();
  }
  std::string file(o_.checkpoint_bytes, '\0');
  const std::string tag = name_ + ":" + std::to_string(step_);
  std::copy_n(tag.begin(), std::min(tag.size(), file.size()), file.begin());
  const uint64_t checksum = fnv1a64(file);
  const Frames frames = encode(CheckpointUpload{name_, step_, checksum, std::move(file)});
  send(frames);
  recorder_.sent(Msg::kCheckpoint, bytesOf(frames));
  checkpoint_sent_ = now;
}

void LoadVolunteer::requestPiece(Clock::time_point now) {
  if (piece_sent_) {
    if (now - *piece_sent_ < o_.chunk_resend) return;
    recorder_.resend();
  }
  if (chunk_at_ >= chunks_.size()) return;
  const PendingChunk& c = chunks_[chunk_at_];
  const uint64_t length = std::min<uint64_t>(o_.piece_bytes, c.bytes - offset_);
  const Frames frames =
      encode(ChunkRequest{name_, c.chunk, offset_, std::max<uint64_t>(1, length)});
  send(frames);
  recorder_.sent(Msg::kChunk, bytesOf(frames));
  piece_sent_ = now;
}

void LoadVolunteer::onPiece(const Frames& frames, Clock::time_point now) {
  std::string why;
  const auto reply = decodeChunkReply(frames, &why);
  if (!reply) return recorder_.problem("malformed chunk reply: " + why);
  if (const auto* r = std::get_if<ChunkRefused>(&*reply)) {
    recorder_.problem("chunk refused: " + r->reason);
    chunks_.clear();  // not served to this cluster: stop asking
    piece_sent_.reset();
    return;
  }
  const auto& p = std::get<ChunkPiece>(*reply);
  if (!piece_sent_ || chunk_at_ >= chunks_.size() || p.chunk != chunks_[chunk_at_].chunk ||
      p.offset != offset_)
    return;  // a late answer to a piece asked again
  recorder_.latency(Msg::kChunk, now - *piece_sent_);
  piece_sent_.reset();
  offset_ += p.bytes.size();
  if (offset_ >= p.total) {
    offset_ = 0;
    if (++chunk_at_ >= chunks_.size()) {  // a round is done: the next one later
      chunk_at_ = 0;
      next_chunks_ = now + o_.chunk_every;
      return;
    }
  }
  requestPiece(now);
}

Clock::time_point LoadVolunteer::tick(Clock::time_point now) {
  if (failed_) return now + std::chrono::hours(1);
  if (phase_ == Phase::kIdle) {
    if (now < start_at_) return start_at_;
    start(now);
    if (failed_) return now + std::chrono::hours(1);
  }
  if (phase_ != Phase::kMember) {
    if (now - start_at_ > o_.join_timeout)
      fail("no answer to the probe or join within the timeout");
    return now + std::chrono::milliseconds(100);
  }
  if (now >= next_beat_) {
    const Frames beat = encode(Heartbeat{name_, state_, step_});
    send(beat);
    recorder_.sent(Msg::kHeartbeat, bytesOf(beat));
    next_beat_ = now + o_.heartbeat;
  }
  Clock::time_point next = next_beat_;
  if (o_.echo_every.count() > 0) {
    if (now >= next_echo_) sendEcho(now);
    next = std::min(next, next_echo_);
  }
  if (assigned_) {
    while (now >= next_step_) step(now);
    if (now >= next_metrics_) sendMetrics(now);
    if (now >= next_checkpoint_ && o_.checkpoint_bytes > 0) sendCheckpoint(now);
    if (!chunks_.empty() && now >= next_chunks_ &&
        (!piece_sent_ || now - *piece_sent_ >= o_.chunk_resend))
      requestPiece(now);
    next = std::min(
        {next, next_step_, next_metrics_, o_.checkpoint_bytes > 0 ? next_checkpoint_ : next});
    if (!chunks_.empty())
      next = std::min(next, piece_sent_ ? *piece_sent_ + o_.chunk_resend : next_chunks_);
  }
  return std::max(next, now + std::chrono::milliseconds(1));
}

}  // namespace cairn::bench::load
