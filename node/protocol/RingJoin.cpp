#include "node/protocol/RingJoin.h"

#include <nlohmann/json.hpp>
#include <set>

namespace cairn {
namespace {

Message ringMessage(const std::string& sender, const std::string& ring_id, std::string text) {
  Message m;
  m.kind = MessageKind::kCollective;
  m.sender = sender;
  m.tag = ringControlTag(ring_id);
  m.text = std::move(text);
  return m;
}

// The header fields both messages share; on success `*ring_id` is the tag's ring id and `*json`
// the parsed text, an object.
bool validRingMessage(const Message& m, std::string* ring_id, nlohmann::json* json,
                      std::string* problem) {
  const std::string prefix = kRingControlTagPrefix;
  if (m.kind != MessageKind::kCollective) {
    *problem = "kind is not collective";
  } else if (m.tag.compare(0, prefix.size(), prefix) != 0 || m.tag.size() == prefix.size()) {
    *problem = "tag \"" + m.tag + "\" is not ring:<ring id>";
  } else if (m.step != 0 || m.microbatch != 0) {
    *problem = "step and microbatch must be 0";
  } else {
    *json = nlohmann::json::parse(m.text, nullptr, /*allow_exceptions=*/false);
    if (!json->is_object() || !json->contains("type") || !(*json)["type"].is_string())
      *problem = "text must be a JSON object with a string \"type\"";
  }
  if (!problem->empty()) return false;
  *ring_id = m.tag.substr(prefix.size());
  return true;
}

template <typename T>
std::optional<T> reject(std::string* why, const std::string& what, const std::string& problem) {
  if (why) *why = what + ": " + problem;
  return std::nullopt;
}

}  // namespace

std::string ringControlTag(const std::string& ring_id) { return kRingControlTagPrefix + ring_id; }

Message encode(const JoinRequest& request) {
  nlohmann::json j{{"type", "join"}};
  if (request.life != 0) j["life"] = request.life;
  return ringMessage(request.sender, request.ring_id, j.dump());
}

Message encode(const Closed& closed) {
  return ringMessage(closed.sender, closed.ring_id,
                     nlohmann::json{{"type", "closed"}, {"life", closed.life}}.dump());
}

Message encode(const Welcome& w) {
  Message m = ringMessage(w.sender, w.ring_id,
                          nlohmann::json{{"type", "welcome"},
                                         {"generation", w.generation},
                                         {"view", w.view},
                                         {"step", w.step},
                                         {"transactions", w.transactions},
                                         {"checksum", w.checksum}}
                              .dump());
  m.tensors = w.tensors;
  return m;
}

namespace {

bool hasType(const Message& m, const char* type) {
  const nlohmann::json j = nlohmann::json::parse(m.text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("type") && j["type"] == type;
}

// "life": absent (0) when `optional`, else an unsigned integer other than 0.
bool lifeOf(const nlohmann::json& j, bool optional, uint64_t* life, std::string* problem) {
  if (!j.contains("life") && optional) return true;
  if (!j.contains("life") || !j["life"].is_number_unsigned() || j["life"].get<uint64_t>() == 0) {
    *problem = "\"life\" must be an unsigned integer other than 0";
    return false;
  }
  *life = j["life"].get<uint64_t>();
  return true;
}

}  // namespace

bool isWelcome(const Message& m) { return hasType(m, "welcome"); }
bool isClosed(const Message& m) { return hasType(m, "closed"); }

namespace {

// A tensor-free ring message of `type` carrying a "life" (join request, closed): its ring id and
// life, or false with the problem.
bool lifeMessage(const Message& m, const std::string& type, bool life_optional, std::string* ring_id,
                 uint64_t* life, std::string* problem) {
  nlohmann::json j;
  if (!validRingMessage(m, ring_id, &j, problem)) return false;
  if (j["type"] != type) {
    *problem = "\"type\" is not " + type;
    return false;
  }
  if (!m.tensors.empty()) {
    *problem = "carries tensors";
    return false;
  }
  return lifeOf(j, life_optional, life, problem);
}

}  // namespace

std::optional<JoinRequest> decodeJoinRequest(const Message& m, std::string* why) {
  JoinRequest request{m.sender, "", 0};
  std::string problem;
  if (!lifeMessage(m, "join", /*life_optional=*/true, &request.ring_id, &request.life, &problem))
    return reject<JoinRequest>(why, "join request", problem);
  return request;
}

std::optional<Closed> decodeClosed(const Message& m, std::string* why) {
  Closed closed{m.sender, "", 0};
  std::string problem;
  if (!lifeMessage(m, "closed", /*life_optional=*/false, &closed.ring_id, &closed.life, &problem))
    return reject<Closed>(why, "closed", problem);
  return closed;
}

std::optional<Welcome> decodeWelcome(const Message& m, std::string* why) {
  Welcome w;
  w.sender = m.sender;
  nlohmann::json j;
  std::string problem;
  if (!validRingMessage(m, &w.ring_id, &j, &problem))
    return reject<Welcome>(why, "welcome", problem);
  if (j["type"] != "welcome") return reject<Welcome>(why, "welcome", "\"type\" is not welcome");
  for (const char* key : {"generation", "step", "transactions", "checksum"})
    if (!j.contains(key) || !j[key].is_number_integer())
      return reject<Welcome>(why, "welcome", std::string("\"") + key + "\" must be an integer");
  if (!j.contains("view") || !j["view"].is_array())
    return reject<Welcome>(why, "welcome", "\"view\" must be an array of member names");
  std::set<std::string> seen;
  for (const auto& v : j["view"]) {
    if (!v.is_string() || v.get<std::string>().empty() || !seen.insert(v.get<std::string>()).second)
      return reject<Welcome>(why, "welcome", "\"view\" must hold distinct non-empty names");
    w.view.push_back(v.get<std::string>());
  }
  w.generation = j["generation"].get<int64_t>();
  if (w.generation < 1) return reject<Welcome>(why, "welcome", "generation must be >= 1");
  w.step = j["step"].get<int64_t>();
  w.transactions = j["transactions"].get<int64_t>();
  w.checksum = j["checksum"].get<uint64_t>();
  w.tensors = m.tensors;
  return w;
}

}  // namespace cairn
