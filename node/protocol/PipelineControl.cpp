#include "node/protocol/PipelineControl.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace cairn {
namespace {

Message control(const ControlOrigin& from, const char* tag, const nlohmann::json& body) {
  Message m;
  m.kind = MessageKind::kControl;
  m.job_id = from.job_id;
  m.sender = from.sender;
  m.tag = tag;
  m.text = body.dump();
  return m;
}

// The JSON object in `m.text` when `m` is the control message `tag`; nullopt with the reason.
std::optional<nlohmann::json> body(const Message& m, const char* tag, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<nlohmann::json> {
    if (why) *why = std::string("a \"") + tag + "\" message: " + reason;
    return std::nullopt;
  };
  if (m.kind != MessageKind::kControl) return fail("not a control message");
  if (m.tag != tag) return fail("tag \"" + m.tag + "\"");
  if (!m.tensors.empty()) return fail("carries tensors");
  auto j = nlohmann::json::parse(m.text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return fail("text is not a JSON object");
  return j;
}

bool fieldIs(const nlohmann::json& j, const char* key, bool (nlohmann::json::*is)() const) {
  return j.contains(key) && (j[key].*is)();
}

// The hello id under `run_key` and `count_key` of a hello's body: unknown when neither is there;
// nullopt when they are malformed (a run not of 1 to kMaxHelloRunChars lowercase hex digits, or a
// count that is not an integer from 1).
std::optional<HelloId> helloId(const nlohmann::json& j, const char* run_key, const char* count_key) {
  if (!j.contains(run_key) && !j.contains(count_key)) return HelloId{};
  if (!fieldIs(j, run_key, &nlohmann::json::is_string) ||
      !fieldIs(j, count_key, &nlohmann::json::is_number_integer))
    return std::nullopt;
  HelloId id{j[run_key].get<std::string>(), j[count_key].get<int64_t>()};
  const bool hex = std::all_of(id.run.begin(), id.run.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
  if (id.run.empty() || id.run.size() > kMaxHelloRunChars || !hex || id.handshake < 1) return std::nullopt;
  return id;
}

}  // namespace

Message encode(const ControlOrigin& from, const Hello& hello) {
  nlohmann::json body{{"stage", hello.stage}, {"cluster", hello.cluster}};
  if (hello.id.known()) {
    body["run"] = hello.id.run;
    body["handshake"] = hello.id.handshake;
  }
  if (hello.heard.known()) {
    body["heard_run"] = hello.heard.run;
    body["heard_handshake"] = hello.heard.handshake;
  }
  return control(from, kHelloTag, body);
}

Message encode(const ControlOrigin& from, const Leaving& leaving) {
  return control(from, kLeavingTag, {{"reason", leaving.reason}, {"lost", leaving.lost}});
}

Message encode(const ControlOrigin& from, const CheckpointSteps& steps) {
  return control(from, kCheckpointStepsTag, {{"steps", steps.steps}});
}

Message encode(const ControlOrigin& from, const ResumeAt& resume) {
  return control(from, kResumeAtTag, {{"step", resume.step}});
}

bool isControl(const Message& m, const char* tag) {
  return m.kind == MessageKind::kControl && m.tag == tag;
}

std::optional<Hello> decodeHello(const Message& m, std::string* why) {
  auto j = body(m, kHelloTag, why);
  if (!j) return std::nullopt;
  Hello hello;
  // Older peers and tests may send a bare hello: the fields are informative, never required.
  if (fieldIs(*j, "stage", &nlohmann::json::is_number_integer)) hello.stage = (*j)["stage"].get<int64_t>();
  if (fieldIs(*j, "cluster", &nlohmann::json::is_number_integer))
    hello.cluster = (*j)["cluster"].get<int64_t>();
  // Its ids are optional too, but when there they must be well-formed.
  const std::optional<HelloId> id = helloId(*j, "run", "handshake");
  const std::optional<HelloId> heard = helloId(*j, "heard_run", "heard_handshake");
  if (!id || !heard) {
    if (why)
      *why = "a \"hello\" message: \"run\"/\"handshake\" and \"heard_run\"/\"heard_handshake\" "
             "must come in pairs: 1 to 32 lowercase hex digits, and an integer from 1";
    return std::nullopt;
  }
  hello.id = *id;
  hello.heard = *heard;
  return hello;
}

std::optional<Leaving> decodeLeaving(const Message& m, std::string* why) {
  auto j = body(m, kLeavingTag, why);
  Leaving leaving;
  // A leaving message is honoured even with a malformed body (the neighbour is going away all the
  // same); only the fields that are well-formed are kept.
  if (!j) {
    if (m.kind != MessageKind::kControl || m.tag != kLeavingTag) return std::nullopt;
    if (why) why->clear();  // accepted: no reason to give (tests/fuzz: a value or a reason, never both)
    return leaving;
  }
  if (fieldIs(*j, "reason", &nlohmann::json::is_string))
    leaving.reason = (*j)["reason"].get<std::string>().substr(0, 64);
  if (fieldIs(*j, "lost", &nlohmann::json::is_string))
    leaving.lost = (*j)["lost"].get<std::string>().substr(0, 256);
  return leaving;
}

std::optional<CheckpointSteps> decodeCheckpointSteps(const Message& m, std::string* why) {
  auto j = body(m, kCheckpointStepsTag, why);
  if (!j) return std::nullopt;
  if (!fieldIs(*j, "steps", &nlohmann::json::is_array) || (*j)["steps"].size() > kMaxCheckpointSteps) {
    if (why) *why = "\"ckpt_steps\" without a \"steps\" array (of at most 100000 steps)";
    return std::nullopt;
  }
  CheckpointSteps out;
  for (const auto& s : (*j)["steps"]) {
    if (!s.is_number_integer() || s.get<int64_t>() < 0) {
      if (why) *why = "\"ckpt_steps\" with a step that is not a non-negative integer: " + s.dump();
      return std::nullopt;
    }
    out.steps.push_back(s.get<int64_t>());
  }
  return out;
}

std::optional<ResumeAt> decodeResumeAt(const Message& m, std::string* why) {
  auto j = body(m, kResumeAtTag, why);
  if (!j) return std::nullopt;
  if (!fieldIs(*j, "step", &nlohmann::json::is_number_integer)) {
    if (why) *why = "\"resume_at\" without an integer \"step\"";
    return std::nullopt;
  }
  return ResumeAt{(*j)["step"].get<int64_t>()};
}

}  // namespace cairn
