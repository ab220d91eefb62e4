// The pipeline's control messages (node/protocol/PipelineControl.h): each encodes to the bytes
// the wire has always carried (kind, tag, JSON text, checked here field by field against a JSON
// document written out by hand), decodes back to what went in, and a malformed one is refused
// with a reason instead of being trusted.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "node/protocol/PipelineControl.h"

namespace cairn {
namespace {

const ControlOrigin kFrom{"job_7", "node_2"};

void expectHeader(const Message& m, const char* tag) {
  EXPECT_EQ(m.kind, MessageKind::kControl);
  EXPECT_EQ(m.tag, tag);
  EXPECT_EQ(m.job_id, "job_7");
  EXPECT_EQ(m.sender, "node_2");
  EXPECT_TRUE(m.tensors.empty());
  EXPECT_TRUE(isControl(m, tag));
}

TEST(PipelineControl, EachMessageRoundTripsWithTheDocumentedBody) {
  const Message hello = encode(kFrom, Hello{2, 1, {}, {}});
  expectHeader(hello, "hello");
  EXPECT_EQ(nlohmann::json::parse(hello.text), nlohmann::json::parse(R"({"stage": 2, "cluster": 1})"));
  const auto h = decodeHello(hello, nullptr);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->stage, 2);
  EXPECT_EQ(h->cluster, 1);

  const Message leaving = encode(kFrom, Leaving{"paused", "node_5"});
  expectHeader(leaving, "leaving");
  EXPECT_EQ(nlohmann::json::parse(leaving.text),
            nlohmann::json::parse(R"({"reason": "paused", "lost": "node_5"})"));
  const auto l = decodeLeaving(leaving, nullptr);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->reason, "paused");
  EXPECT_EQ(l->lost, "node_5");

  const Message steps = encode(kFrom, CheckpointSteps{{4, 8, 12}});
  expectHeader(steps, "ckpt_steps");
  EXPECT_EQ(nlohmann::json::parse(steps.text), nlohmann::json::parse(R"({"steps": [4, 8, 12]})"));
  const auto s = decodeCheckpointSteps(steps, nullptr);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->steps, (std::vector<int64_t>{4, 8, 12}));

  const Message resume = encode(kFrom, ResumeAt{-1});
  expectHeader(resume, "resume_at");
  EXPECT_EQ(nlohmann::json::parse(resume.text), nlohmann::json::parse(R"({"step": -1})"));
  const auto r = decodeResumeAt(resume, nullptr);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->step, -1);
}

Message raw(const char* tag, const std::string& text, MessageKind kind = MessageKind::kControl) {
  Message m;
  m.kind = kind;
  m.tag = tag;
  m.text = text;
  return m;
}

TEST(PipelineControl, MalformedMessagesAreRefusedWithAReason) {
  std::string why;
  EXPECT_FALSE(decodeCheckpointSteps(raw("ckpt_steps", "not json"), &why));
  EXPECT_NE(why.find("not a JSON object"), std::string::npos) << why;
  EXPECT_FALSE(decodeCheckpointSteps(raw("ckpt_steps", R"({"steps": 3})"), &why));
  EXPECT_NE(why.find("without a \"steps\" array"), std::string::npos) << why;
  EXPECT_FALSE(decodeCheckpointSteps(raw("ckpt_steps", R"({"steps": [1, -2]})"), &why));
  EXPECT_NE(why.find("not a non-negative integer: -2"), std::string::npos) << why;
  EXPECT_FALSE(decodeCheckpointSteps(raw("ckpt_steps", R"({"steps": [1, "x"]})"), &why));
  EXPECT_FALSE(decodeResumeAt(raw("resume_at", R"({"step": 1.5})"), &why));
  EXPECT_NE(why.find("without an integer \"step\""), std::string::npos) << why;
  EXPECT_FALSE(decodeResumeAt(raw("resume_at", R"([1])"), &why));
  // The right body under another tag or kind is not this message.
  EXPECT_FALSE(decodeResumeAt(raw("ckpt_steps", R"({"step": 1})"), &why));
  EXPECT_FALSE(decodeResumeAt(raw("resume_at", R"({"step": 1})", MessageKind::kActivation), &why));
  EXPECT_FALSE(isControl(raw("resume_at", "{}", MessageKind::kGradient), "resume_at"));
  // Too many steps in one message.
  std::string many = "{\"steps\": [";
  for (size_t i = 0; i <= kMaxCheckpointSteps; ++i) many += (i ? ",1" : "1");
  EXPECT_FALSE(decodeCheckpointSteps(raw("ckpt_steps", many + "]}"), &why));
}

TEST(PipelineControl, AHellosIdsRoundTripAndAreOptionalButWellFormed) {
  const Message hello = encode(kFrom, Hello{1, 0, HelloId{"0a1b2c3d4e5f6071", 3}, HelloId{"ff", 1}});
  EXPECT_EQ(nlohmann::json::parse(hello.text),
            nlohmann::json::parse(R"({"stage": 1, "cluster": 0, "run": "0a1b2c3d4e5f6071",
                                      "handshake": 3, "heard_run": "ff", "heard_handshake": 1})"));
  auto h = decodeHello(hello, nullptr);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->id, (HelloId{"0a1b2c3d4e5f6071", 3}));
  EXPECT_EQ(h->heard, (HelloId{"ff", 1}));
  // An older node's hello: no ids, both unknown.
  h = decodeHello(raw("hello", R"({"stage": 1})"), nullptr);
  ASSERT_TRUE(h.has_value());
  EXPECT_FALSE(h->id.known());
  EXPECT_FALSE(h->heard.known());
  // Ids come in pairs of a run of 1 to 32 lowercase hex digits and a count from 1.
  std::string why;
  for (const char* body : {R"({"run": "ab"})", R"({"handshake": 1})", R"({"run": "AB", "handshake": 1})",
                           R"({"run": "", "handshake": 1})", R"({"run": "ab", "handshake": 0})",
                           R"({"run": "ab", "handshake": 1.5})", R"({"run": 7, "handshake": 1})",
                           R"({"run": "ab", "handshake": 1, "heard_run": "zz", "heard_handshake": 2})",
                           R"({"heard_run": "ab"})"}) {
    why.clear();
    EXPECT_FALSE(decodeHello(raw("hello", body), &why).has_value()) << body;
    EXPECT_NE(why.find("must come in pairs"), std::string::npos) << body << ": " << why;
  }
  EXPECT_FALSE(decodeHello(raw("hello", nlohmann::json{{"run", std::string(33, 'a')}, {"handshake", 1}}.dump()),
                           &why).has_value());
  EXPECT_TRUE(decodeHello(raw("hello", nlohmann::json{{"run", std::string(32, 'a')}, {"handshake", 1}}.dump()),
                          &why).has_value());
}

TEST(PipelineControl, LeavingIsHonouredWithWhatIsWellFormed) {
  // A neighbour that says it leaves is going away whatever its body says; only well-formed fields
  // are kept, and strings are bounded.
  auto l = decodeLeaving(raw("leaving", "garbage"), nullptr);
  ASSERT_TRUE(l.has_value());
  EXPECT_TRUE(l->reason.empty());
  l = decodeLeaving(raw("leaving", R"({"reason": 7, "lost": "node_1"})"), nullptr);
  ASSERT_TRUE(l.has_value());
  EXPECT_TRUE(l->reason.empty());
  EXPECT_EQ(l->lost, "node_1");
  l = decodeLeaving(raw("leaving", nlohmann::json{{"reason", std::string(500, 'r')}}.dump()), nullptr);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->reason.size(), 64u);
  EXPECT_FALSE(decodeLeaving(raw("hello", "{}"), nullptr).has_value());
}

}  // namespace
}  // namespace cairn
