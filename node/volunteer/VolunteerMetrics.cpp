#include "node/volunteer/VolunteerMetrics.h"

#include <algorithm>
#include <random>

#include "core/Error.h"
#include "core/Log.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/volunteer/VolunteerSockets.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A new stream name per volunteer process: 16 random hex digits from the kernel's entropy.
std::string newStream() {
  std::random_device device;
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) out.push_back(digits[device() & 15]);
  return out;
}

double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

VolunteerMetrics::VolunteerMetrics(zmq::context_t& context, const CurveKeyPair& own,
                                   const Invite& invite, std::string name, MetricsStreamOptions options)
    : socket_(volunteerSocket(context, own, invite, /*immediate=*/true, options.max_message_bytes, 1)),
      coordinator_(invite.address()),
      name_(std::move(name)),
      stream_(newStream()),
      options_(options),
      queue_(options.capacity) {
  thread_ = std::thread([this] { run(); });
}

VolunteerMetrics::~VolunteerMetrics() { stop(); }

void VolunteerMetrics::record(const nlohmann::json& record, const std::string& line) {
  auto step = record.find("step");
  if (step != record.end() && step->is_number_integer() && record.contains("loss"))
    step_.store(step->get<int64_t>(), std::memory_order_relaxed);
  queue_.push(line);
}

void VolunteerMetrics::event(nlohmann::json event) {
  auto state = event.find("state");
  if (state != event.end() && state->is_string()) {
    std::lock_guard<std::mutex> lock(state_mutex_);
    state_ = state->get<std::string>().substr(0, 64);
  }
  event["t"] = unixSeconds();
  queue_.push(event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::pair<std::string, int64_t> VolunteerMetrics::progress() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return {state_, step_.load(std::memory_order_relaxed)};
}

bool VolunteerMetrics::finish(milliseconds timeout) {
  const auto by = Clock::now() + timeout;
  finish_by_ns_ = std::max<int64_t>(1, by.time_since_epoch().count());
  if (thread_.joinable()) thread_.join();
  return all_acked_.load();
}

void VolunteerMetrics::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void VolunteerMetrics::readReplies(milliseconds wait) {
  const auto message = receiveReply(socket_, wait, options_.max_message_bytes, "metrics");
  if (!message) return;
  if (const auto* r = std::get_if<Rejected>(&*message)) {
    // Sending the same records again would be refused again: they are given up.
    CAIRN_WARN("the coordinator refused a batch of metrics records (given up): ", r->reason);
    if (in_flight_) queue_.acknowledge(in_flight_end_);
    in_flight_ = false;
    return;
  }
  const auto* ack = std::get_if<MetricsAck>(&*message);
  if (!ack || ack->name != name_ || ack->stream != stream_) return;
  queue_.acknowledge(ack->seq);
  acked_seq_ = std::max(acked_seq_.load(), ack->seq);
  if (in_flight_ && ack->seq >= in_flight_end_) in_flight_ = false;
}

void VolunteerMetrics::run() {
  auto next_send = Clock::now();
  auto last_taken = Clock::now();
  bool away = false;
  while (!stop_.load()) {
    const auto now = Clock::now();
    const int64_t by = finish_by_ns_.load();
    const bool finishing = by != 0;
    if (finishing && queue_.size() == 0) {
      all_acked_ = true;
      break;
    }
    if (finishing && now.time_since_epoch().count() >= by) {
      CAIRN_WARN("the coordinator did not acknowledge ", queue_.size(),
                 " metrics records before this volunteer stopped");
      break;
    }
    if (in_flight_ && now - sent_at_ > options_.ack_timeout) in_flight_ = false;  // send again
    const size_t queued = queue_.size();
    if (!in_flight_ && queued > 0 &&
        (now >= next_send || queued >= options_.batch_records || finishing)) {
      next_send = now + options_.interval;
      std::vector<QueuedRecord> batch = queue_.peek(options_.batch_records, options_.batch_bytes);
      MetricsBatch m;
      m.name = name_;
      m.stream = stream_;
      m.seq = batch.front().seq;
      m.dropped = queue_.dropped();
      m.records.reserve(batch.size());
      for (const QueuedRecord& r : batch)
        m.records.push_back(nlohmann::json::parse(r.line, nullptr, /*allow_exceptions=*/false));
      if (trySendFrames(socket_, encode(m))) {
        batches_sent_.fetch_add(1);
        in_flight_ = true;
        in_flight_end_ = batch.back().seq + 1;
        sent_at_ = now;
        last_taken = now;
        if (away) CAIRN_INFO("the coordinator at ", coordinator_, " takes metrics records again");
        away = false;
      } else if (!away && now - last_taken >= milliseconds(10000)) {
        away = true;
        CAIRN_INFO("the coordinator at ", coordinator_, " takes no metrics records now (down or "
                   "unreachable); up to ", options_.capacity, " wait for it, the oldest dropped first");
      }
    }
    const auto until_next = std::chrono::duration_cast<milliseconds>(next_send - Clock::now());
    readReplies(in_flight_ ? milliseconds(100)
                           : std::clamp(until_next, milliseconds(1), milliseconds(100)));
  }
  socket_.close();
}

}  // namespace cairn
