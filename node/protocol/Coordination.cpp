#include "node/protocol/Coordination.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "node/protocol/CoordinationFields.h"
#include "node/protocol/CoordinationRelay.h"
#include "node/protocol/VolunteerProbeCodec.h"

namespace cairn {
namespace {

using coordination_detail::Fields;

constexpr size_t kMaxTokenBytes = 256;
constexpr size_t kMaxAddressBytes = 300;
constexpr size_t kMaxStateBytes = 64;

Frames frames(nlohmann::json header, std::vector<std::string> attachments = {}) {
  header["protocol"] = kCoordinationProtocol;
  Frames out;
  out.reserve(1 + attachments.size());
  out.push_back(header.dump());
  for (auto& a : attachments) out.push_back(std::move(a));
  return out;
}

// Parses frame 0 and checks the envelope; returns the header and sets `*type`.
std::optional<nlohmann::json> header(const Frames& f, size_t attachment_limit, std::string* type,
                                     std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<nlohmann::json> {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (f.empty()) return fail("empty message");
  if (f[0].size() > kMaxCoordinationHeaderBytes)
    return fail("header of " + std::to_string(f[0].size()) + " bytes exceeds " +
                std::to_string(kMaxCoordinationHeaderBytes));
  nlohmann::json j = nlohmann::json::parse(f[0], nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return fail("header is not a JSON object");
  auto p = j.find("protocol");
  if (p == j.end() || !p->is_number_integer() || p->get<int64_t>() != kCoordinationProtocol)
    return fail("\"protocol\" must be " + std::to_string(kCoordinationProtocol) +
                " (a different cairn version?)");
  auto t = j.find("type");
  if (t == j.end() || !t->is_string() || t->get<std::string>().size() > 64)
    return fail("header has no string \"type\"");
  for (size_t i = 1; i < f.size(); ++i)
    if (f[i].size() > attachment_limit)
      return fail(t->get<std::string>() + ": attachment of " + std::to_string(f[i].size()) +
                  " bytes exceeds the limit of " + std::to_string(attachment_limit));
  *type = t->get<std::string>();
  return j;
}

bool attachments(const Frames& f, size_t min, size_t max, const std::string& type, std::string* why) {
  const size_t n = f.size() - 1;
  if (n >= min && n <= max) return true;
  if (why)
    *why = type + ": " + std::to_string(n) + " attachments, expected " +
           (min == max ? std::to_string(min) : std::to_string(min) + " to " + std::to_string(max));
  return false;
}

template <typename Variant, typename T>
std::optional<Variant> done(Fields& fields, T value) {
  if (!fields.ok()) return std::nullopt;
  return Variant(std::move(value));
}

bool isHex(const std::string& s) {
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

bool validStream(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'))) return false;
  return true;
}

// Empty when `r` is an acceptable metrics record; else what is wrong with it. The coordinator
// tags the lines it writes with node, cluster, stream and seq: a record may not carry them.
std::string metricsRecordProblem(const nlohmann::json& r) {
  if (!r.is_object()) return "must be a JSON object";
  if (r.size() > 64) return "has more than 64 keys";
  for (const char* reserved : {"node", "cluster", "stream", "seq"})
    if (r.contains(reserved)) return std::string("has the key \"") + reserved + "\", which the coordinator adds";
  auto step = r.find("step");
  if (step != r.end() && !(step->is_number_integer() && step->get<int64_t>() >= 0 &&
                           !(step->is_number_unsigned() && step->get<uint64_t>() > uint64_t(INT64_MAX))))
    return "\"step\" must be a non-negative integer";
  auto state = r.find("state");
  if (state != r.end() && !(state->is_string() && !state->get<std::string>().empty() &&
                            state->get<std::string>().size() <= kMaxStateBytes))
    return "\"state\" must be a string of 1 to " + std::to_string(kMaxStateBytes) + " bytes";
  return {};
}

}  // namespace

Frames encode(const JoinAsk& m) {
  nlohmann::json h = {{"type", "join"},
                      {"token", m.token},
                      {"advertise", m.advertise},
                      {"probe", encodeVolunteerProbe(m.probe)}};
  if (!m.name.empty()) h["name"] = m.name;
  if (m.relay_mbps) h["relay"] = {{"mbps", *m.relay_mbps}};
  return frames(std::move(h));
}
Frames encode(const BandwidthProbeMsg& m) {
  return frames({{"type", "bandwidth"}, {"bytes", m.payload.size()}}, {m.payload});
}
Frames encode(const Heartbeat& m) {
  nlohmann::json h = {{"type", "heartbeat"}, {"name", m.name}, {"state", m.state}, {"step", m.step}};
  if (m.relay) h["relay"] = coordination_detail::encodeRelayFigures(*m.relay);
  return frames(std::move(h));
}
Frames encode(const ResultUpload& m) {
  return frames({{"type", "result"}, {"name", m.name}, {"summary", m.summary}}, {m.trained_stage});
}
Frames encode(const CheckpointUpload& m) {
  return frames({{"type", "checkpoint"}, {"name", m.name}, {"step", m.step}, {"checksum", m.checksum}},
                {m.file});
}
Frames encode(const LeavingNotice& m) {
  return frames({{"type", "leaving"}, {"name", m.name}, {"reason", m.reason}});
}
Frames encode(const MetricsBatch& m) {
  return frames({{"type", "metrics"},
                 {"name", m.name},
                 {"stream", m.stream},
                 {"seq", m.seq},
                 {"records", m.records},
                 {"dropped", m.dropped}});
}
Frames encode(const MetricsAck& m) {
  return frames({{"type", "metrics_ack"}, {"name", m.name}, {"stream", m.stream}, {"seq", m.seq}});
}
Frames encode(const Accepted& m) {
  nlohmann::json header = {{"type", "accepted"}, {"name", m.name}, {"state", m.state}};
  if (!m.note.empty()) header["note"] = m.note;
  if (!m.reachability.empty()) header["reachability"] = m.reachability;
  return frames(header);
}
Frames encode(const Rejected& m) {
  nlohmann::json header = {{"type", "rejected"}, {"reason", m.reason}};
  if (m.node_taken) header["node_taken"] = true;  // absent when false: older volunteers read it as before
  return frames(header);
}
Frames encode(const BandwidthAck& m) { return frames({{"type", "bandwidth_ack"}, {"bytes", m.bytes}}); }
Frames encode(const Assignment& m) {
  std::vector<std::string> att{m.stage};
  if (m.checkpoint) att.push_back(*m.checkpoint);
  return frames({{"type", "assignment"},
                 {"name", m.name},
                 {"node", m.node},
                 {"job", m.job},
                 {"num_clusters", m.num_clusters},
                 {"resume", m.checkpoint.has_value()},
                 {"checkpoint_step", m.checkpoint_step}},
                std::move(att));
}
Frames encode(const RelayLinksUpdate& m) { return frames(coordination_detail::encodeRelayLinks(m)); }
Frames encode(const PeersUpdate& m) {
  return frames({{"type", "peers"}, {"name", m.name}, {"node", m.node}});
}
Frames encode(const ResultAck& m) { return frames({{"type", "result_ack"}, {"name", m.name}}); }
Frames encode(const CheckpointAck& m) {
  nlohmann::json h{{"type", "checkpoint_ack"}, {"name", m.name}, {"step", m.step}};
  if (m.keep_from >= 0) h["keep_from"] = m.keep_from;
  return frames(h);
}
Frames encode(const Finished& m) { return frames({{"type", "finished"}, {"reason", m.reason}}); }
Frames encode(const ReachCheck& m) { return frames({{"type", "reach"}, {"nonce", m.nonce}}); }
Frames encode(const ReachOk& m) { return frames({{"type", "reach_ok"}, {"nonce", m.nonce}}); }

namespace {

// The decoders of decodeToCoordinator's longer messages; `in` reads the header `h`.
std::optional<ToCoordinator> decodeJoin(const Frames& f, const nlohmann::json& h, Fields& in,
                                        const std::string& type, std::string* why) {
  if (!attachments(f, 0, 0, type, why)) return std::nullopt;
  JoinAsk m;
  m.token = in.string("token", kMaxTokenBytes);
  m.advertise = in.string("advertise", kMaxAddressBytes, /*allow_empty=*/true);  // "": dial-out only
  m.name = in.optionalString("name", kMaxNodeNameBytes);
  const nlohmann::json probe = in.object("probe");
  m.relay_mbps = coordination_detail::decodeRelayOffer(h, in);
  if (!in.ok()) return std::nullopt;
  if (!decodeVolunteerProbe(probe, &m.probe, why)) return std::nullopt;
  return ToCoordinator(std::move(m));
}

std::optional<ToCoordinator> decodeBandwidth(Frames& f, size_t limit, Fields& in,
                                             const std::string& type, std::string* why) {
  if (!attachments(f, 1, 1, type, why)) return std::nullopt;
  const int64_t bytes = in.integer("bytes", 0, int64_t(limit));
  if (in.ok() && size_t(bytes) != f[1].size()) {
    if (why)
      *why = "bandwidth: \"bytes\" says " + std::to_string(bytes) + " but the attachment has " +
             std::to_string(f[1].size());
    return std::nullopt;
  }
  return done<ToCoordinator>(in, BandwidthProbeMsg{std::move(f[1])});
}

std::optional<ToCoordinator> decodeCheckpoint(Frames& f, Fields& in, const std::string& type,
                                              AttachmentChecksum checksum, std::string* why) {
  if (!attachments(f, 1, 1, type, why)) return std::nullopt;
  CheckpointUpload m;
  m.name = in.string("name", kMaxNodeNameBytes);
  m.step = in.integer("step", 0, INT64_MAX);
  m.checksum = in.unsignedInteger("checksum");
  m.file = std::move(f[1]);
  if (in.ok() && checksum == AttachmentChecksum::kVerify && fnv1a64(m.file) != m.checksum) {
    if (why) *why = "checkpoint: the attachment does not match its checksum";
    return std::nullopt;
  }
  return done<ToCoordinator>(in, std::move(m));
}

std::optional<ToCoordinator> decodeMetrics(const Frames& f, const nlohmann::json& h, Fields& in,
                                           const std::string& type, std::string* why) {
  if (!attachments(f, 0, 0, type, why)) return std::nullopt;
  MetricsBatch m;
  m.name = in.string("name", kMaxNodeNameBytes);
  m.stream = in.string("stream", 64);
  m.seq = in.integer("seq", 0, INT64_MAX / 2);
  m.dropped = in.integer("dropped", 0, INT64_MAX / 2);
  if (!in.ok()) return std::nullopt;
  if (!validStream(m.stream)) {
    if (why) *why = "metrics: \"stream\" must be 1 to 64 characters 0-9 and a-z";
    return std::nullopt;
  }
  auto records = h.find("records");
  if (records == h.end() || !records->is_array() || records->size() > kMaxMetricsRecords) {
    if (why) *why = "metrics: \"records\" must be an array of at most " +
                    std::to_string(kMaxMetricsRecords) + " records";
    return std::nullopt;
  }
  for (size_t i = 0; i < records->size(); ++i) {
    std::string problem = metricsRecordProblem((*records)[i]);
    if (!problem.empty()) {
      if (why) *why = "metrics: records[" + std::to_string(i) + "] " + problem;
      return std::nullopt;
    }
  }
  m.records = records->get<std::vector<nlohmann::json>>();
  return ToCoordinator(std::move(m));
}

}  // namespace

std::optional<ToCoordinator> decodeToCoordinator(const Frames& frames, size_t limit, std::string* why) {
  Frames copy(frames);
  return decodeToCoordinator(std::move(copy), limit, why, AttachmentChecksum::kVerify);
}

std::optional<ToCoordinator> decodeToCoordinator(Frames&& f, size_t limit, std::string* why,
                                                 AttachmentChecksum checksum) {
  std::string type;
  const auto h = header(f, limit, &type, why);
  if (!h) return std::nullopt;
  Fields in(*h, type, why);
  using V = ToCoordinator;
  if (type == "join") return decodeJoin(f, *h, in, type, why);
  if (type == "bandwidth") return decodeBandwidth(f, limit, in, type, why);
  if (type == "heartbeat") {
    if (!attachments(f, 0, 0, type, why)) return std::nullopt;
    Heartbeat m;
    m.name = in.string("name", kMaxNodeNameBytes);
    m.state = in.string("state", kMaxStateBytes);
    m.step = in.integer("step", -1, INT64_MAX);
    m.relay = coordination_detail::decodeRelayFigures(*h, in);
    return done<V>(in, std::move(m));
  }
  if (type == "result") {
    if (!attachments(f, 1, 1, type, why)) return std::nullopt;
    ResultUpload m;
    m.name = in.string("name", kMaxNodeNameBytes);
    m.summary = in.object("summary");
    m.trained_stage = std::move(f[1]);
    return done<V>(in, std::move(m));
  }
  if (type == "checkpoint") return decodeCheckpoint(f, in, type, checksum, why);
  if (type == "leaving") {
    if (!attachments(f, 0, 0, type, why)) return std::nullopt;
    LeavingNotice m;
    m.name = in.string("name", kMaxNodeNameBytes);
    m.reason = in.string("reason", kMaxReasonBytes, /*allow_empty=*/true);
    return done<V>(in, std::move(m));
  }
  if (type == "metrics") return decodeMetrics(f, *h, in, type, why);
  if (why) *why = "unknown message type \"" + type + "\" for the coordinator";
  return std::nullopt;
}

std::optional<ToVolunteer> decodeToVolunteer(const Frames& f, size_t limit, std::string* why) {
  std::string type;
  const auto h = header(f, limit, &type, why);
  if (!h) return std::nullopt;
  Fields in(*h, type, why);
  using V = ToVolunteer;
  if (type == "assignment") {
    const bool resume = in.boolean("resume");
    if (!in.ok() || !attachments(f, resume ? 2 : 1, resume ? 2 : 1, type, why)) return std::nullopt;
    Assignment m;
    m.name = in.string("name", kMaxNodeNameBytes);
    m.node = in.object("node");
    m.job = in.object("job");
    m.num_clusters = in.integer("num_clusters", 1, 1 << 20);
    m.checkpoint_step = in.integer("checkpoint_step", -1, INT64_MAX);
    m.stage = f[1];
    if (resume) m.checkpoint = f[2];
    return done<V>(in, std::move(m));
  }
  if (!attachments(f, 0, 0, type, why)) return std::nullopt;
  if (type == "accepted") {
    Accepted m;
    m.name = in.string("name", kMaxNodeNameBytes);
    m.state = in.string("state", kMaxStateBytes);
    m.note = in.optionalString("note", kMaxNoteBytes);
    m.reachability = in.optionalString("reachability", kMaxNoteBytes);
    return done<V>(in, std::move(m));
  }
  if (type == "rejected") {
    Rejected m{in.string("reason", kMaxReasonBytes)};
    m.node_taken = in.optionalBoolean("node_taken");
    return done<V>(in, std::move(m));
  }
  if (type == "bandwidth_ack")
    return done<V>(in, BandwidthAck{in.integer("bytes", 0, INT64_MAX)});
  if (type == "peers") {
    PeersUpdate m;
    m.name = in.string("name", kMaxNodeNameBytes);
    m.node = in.object("node");
    return done<V>(in, std::move(m));
  }
  if (type == "relay_links") {
    auto m = coordination_detail::decodeRelayLinks(*h, in);
    if (!m) return std::nullopt;
    return done<V>(in, std::move(*m));
  }
  if (type == "result_ack") return done<V>(in, ResultAck{in.string("name", kMaxNodeNameBytes)});
  if (type == "checkpoint_ack") {
    CheckpointAck m;
    m.name = in.string("name", kMaxNodeNameBytes);
    m.step = in.integer("step", 0, INT64_MAX);
    if (h->contains("keep_from")) m.keep_from = in.integer("keep_from", 0, INT64_MAX);
    return done<V>(in, std::move(m));
  }
  if (type == "metrics_ack") {
    MetricsAck m;
    m.name = in.string("name", kMaxNodeNameBytes);
    m.stream = in.string("stream", 64);
    m.seq = in.integer("seq", 0, INT64_MAX / 2);
    return done<V>(in, std::move(m));
  }
  if (type == "finished")
    return done<V>(in, Finished{in.string("reason", kMaxReasonBytes, /*allow_empty=*/true)});
  if (why) *why = "unknown message type \"" + type + "\" for a volunteer";
  return std::nullopt;
}

std::optional<ReachMessage> decodeReach(const Frames& f, std::string* why) {
  std::string type;
  const auto h = header(f, 0, &type, why);
  if (!h) return std::nullopt;
  if (!attachments(f, 0, 0, type, why)) return std::nullopt;
  Fields in(*h, type, why);
  if (type == "reach") return done<ReachMessage>(in, ReachCheck{in.string("nonce", 128)});
  if (type == "reach_ok") return done<ReachMessage>(in, ReachOk{in.string("nonce", 128)});
  if (why) *why = "unknown message type \"" + type + "\" for a reachability check";
  return std::nullopt;
}


namespace {
constexpr const char* kInvitePrefix = "cairn-invite:1:";
std::string toHex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}
}  // namespace

std::string formatInvite(const Invite& invite) {
  return std::string(kInvitePrefix) + invite.host + ":" + std::to_string(invite.port) + ":" +
         toHex(invite.coordinator_key) + ":" + invite.token;
}

Invite parseInvite(const std::string& text) {
  const std::string prefix = kInvitePrefix;
  auto bad = [&](const std::string& what) {
    CAIRN_THROW(BadInput, "--join: the invite \"", text.substr(0, 200), "\" ", what,
                " (expected cairn-invite:1:<host>:<port>:<coordinator key, 80 hex>:<token hex>, "
                "as `clusterize --serve` prints it)");
  };
  if (text.compare(0, prefix.size(), prefix) != 0) bad("does not start with " + prefix);
  // host may itself contain ':' only as an IPv6 literal in brackets; split from the right.
  const std::string rest = text.substr(prefix.size());
  const size_t token_colon = rest.rfind(':');
  if (token_colon == std::string::npos) bad("has no token");
  const size_t key_colon = rest.rfind(':', token_colon - 1);
  if (key_colon == std::string::npos || token_colon == 0) bad("has no coordinator key");
  const size_t port_colon = key_colon == 0 ? std::string::npos : rest.rfind(':', key_colon - 1);
  if (port_colon == std::string::npos || port_colon == 0) bad("has no host:port");
  Invite invite;
  invite.host = rest.substr(0, port_colon);
  const std::string port = rest.substr(port_colon + 1, key_colon - port_colon - 1);
  const std::string key_hex = rest.substr(key_colon + 1, token_colon - key_colon - 1);
  invite.token = rest.substr(token_colon + 1);
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) ||
      std::stoi(port) < 1 || std::stoi(port) > 65535)
    bad("has port \"" + port + "\", not a number in 1..65535");
  invite.port = std::stoi(port);
  if (key_hex.size() != 80 || !isHex(key_hex)) bad("has a coordinator key that is not 80 hex digits");
  for (size_t i = 0; i < key_hex.size(); i += 2)
    invite.coordinator_key.push_back(char(std::stoi(key_hex.substr(i, 2), nullptr, 16)));
  if (!isZ85Key(invite.coordinator_key)) bad("has a coordinator key that is not a CURVE public key");
  if (invite.token.size() < 32 || invite.token.size() > 128 || !isHex(invite.token))
    bad("has a token that is not 32 to 128 hex digits");
  return invite;
}

}  // namespace cairn
