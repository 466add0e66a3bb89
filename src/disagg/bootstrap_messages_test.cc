// Bootstrap control plane, the message codec: round trips of every type,
// the stable wire spelling, garbage and wrong fields named, random
// mutations that never crash. (The Endpoint over real sockets:
// bootstrap_test.cc.)
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "disagg/bootstrap.h"
#include "disagg/bootstrap_test_util.h"

namespace strata::disagg {
namespace {

using json = nlohmann::json;
using test::Group;
using test::MakeHello;
using test::TestLayout;
// One of every message type, with edge values.
std::vector<Message> SampleMessages() {
  std::vector<Message> v;
  Hello h = MakeHello("decode", "00ff00ff00ff00ff");
  h.layout.page_size = 1;
  h.layout.groups = {Group("full_attention", 2, 1, 4, DType::kF32, true),
                     Group("sliding", 3, 2, 8, DType::kF16, true, 4096),
                     Group("latent", 1, 1, 576, DType::kBF16, false)};
  for (int i = 0; i < 256; ++i) h.transport_descriptor += static_cast<char>(i);
  h.model = "Qwen/Qwen3-0.6B \xe2\x9c\x93";
  v.push_back(h);
  v.push_back(MakeHello("prefill", "p1"));
  v.push_back(RoomReady{std::numeric_limits<uint64_t>::max(), 1000, 3, {0, 7, 1073741823, 42}});
  v.push_back(RoomReady{0, 1, 0, {}});
  RoomDone d;
  d.room = (uint64_t{1} << 53) - 1;
  d.first_token = 151643;
  d.logprob = -0.125f;
  d.top_logprobs = {{151643, -0.125f},
                    {5, -3.0e-8f},
                    {7, -std::numeric_limits<float>::infinity()},
                    {9, std::numeric_limits<float>::quiet_NaN()},
                    {11, std::numeric_limits<float>::infinity()},
                    {13, -std::numeric_limits<float>::max()}};
  d.prompt_tokens = 12345;
  d.cached_tokens = 12345;
  d.finished = true;
  d.finish_reason = "stop";
  v.push_back(d);
  v.push_back(RoomDone{7, 0, 0.0f, {}, 1, 0, false, ""});
  for (FailureReason r :
       {FailureReason::kBootstrapTimeout, FailureReason::kTransferTimeout, FailureReason::kPeerLost,
        FailureReason::kAborted, FailureReason::kRejected}) {
    RoomFailed f;  // named, not a temporary: g++ 12 warns falsely through the variant
    f.room = 99;
    f.reason = r;
    f.message = "what \"and\" why\n\t\\";
    v.emplace_back(std::move(f));
  }
  v.push_back(Heartbeat{0});
  v.push_back(Heartbeat{std::numeric_limits<uint64_t>::max()});
  return v;
}

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

// ---- messages ---------------------------------------------------------------

TEST(BootstrapMessages, RoundTripEveryType) {
  for (const Message& m : SampleMessages()) {
    const std::string wire = EncodeMessage(m);
    StatusOr<Message> back = DecodeMessage(wire);
    ASSERT_TRUE(back.ok()) << wire << "\n" << back.status().ToString();
    ASSERT_EQ(back->index(), m.index()) << wire;
    EXPECT_EQ(EncodeMessage(*back), wire);
    if (const auto* h = std::get_if<Hello>(&m)) {
      const Hello& b = std::get<Hello>(*back);
      EXPECT_EQ(b.instance_id, h->instance_id);
      EXPECT_EQ(b.role, h->role);
      EXPECT_EQ(b.model, h->model);
      EXPECT_EQ(b.num_pages, h->num_pages);
      EXPECT_EQ(b.transport, h->transport);
      EXPECT_EQ(b.transport_descriptor, h->transport_descriptor);  // binary, via base64
      EXPECT_EQ(b.layout.page_size, h->layout.page_size);
      ASSERT_EQ(b.layout.groups.size(), h->layout.groups.size());
      for (size_t g = 0; g < b.layout.groups.size(); ++g) {
        const PoolGroupSpec& x = b.layout.groups[g];
        const PoolGroupSpec& y = h->layout.groups[g];
        EXPECT_EQ(x.name, y.name);
        EXPECT_EQ(x.num_layers, y.num_layers);
        EXPECT_EQ(x.num_kv_heads, y.num_kv_heads);
        EXPECT_EQ(x.head_dim, y.head_dim);
        EXPECT_EQ(x.dtype, y.dtype);
        EXPECT_EQ(x.has_v, y.has_v);
        EXPECT_EQ(x.sliding_window, y.sliding_window);
      }
    } else if (const auto* r = std::get_if<RoomReady>(&m)) {
      const RoomReady& b = std::get<RoomReady>(*back);
      EXPECT_EQ(b.room, r->room);
      EXPECT_EQ(b.prompt_tokens, r->prompt_tokens);
      EXPECT_EQ(b.first_page, r->first_page);
      EXPECT_EQ(b.dst_pages, r->dst_pages);
    } else if (const auto* d = std::get_if<RoomDone>(&m)) {
      const RoomDone& b = std::get<RoomDone>(*back);
      EXPECT_EQ(b.room, d->room);
      EXPECT_EQ(b.first_token, d->first_token);
      EXPECT_TRUE(SameFloat(b.logprob, d->logprob));
      ASSERT_EQ(b.top_logprobs.size(), d->top_logprobs.size());
      for (size_t i = 0; i < b.top_logprobs.size(); ++i) {
        EXPECT_EQ(b.top_logprobs[i].token, d->top_logprobs[i].token);
        EXPECT_TRUE(SameFloat(b.top_logprobs[i].logprob, d->top_logprobs[i].logprob)) << i;
      }
      EXPECT_EQ(b.prompt_tokens, d->prompt_tokens);
      EXPECT_EQ(b.cached_tokens, d->cached_tokens);
      EXPECT_EQ(b.finished, d->finished);
      EXPECT_EQ(b.finish_reason, d->finish_reason);
    } else if (const auto* f = std::get_if<RoomFailed>(&m)) {
      const RoomFailed& b = std::get<RoomFailed>(*back);
      EXPECT_EQ(b.room, f->room);
      EXPECT_EQ(b.reason, f->reason);
      EXPECT_EQ(b.message, f->message);
    } else {
      EXPECT_EQ(std::get<Heartbeat>(*back).seq, std::get<Heartbeat>(m).seq);
    }
  }
}

TEST(BootstrapMessages, WireSpellingIsStable) {
  // Other implementations (and old logs) read these names.
  EXPECT_EQ(EncodeMessage(Heartbeat{3}), R"({"type":"heartbeat","seq":3})");
  EXPECT_EQ(EncodeMessage(RoomFailed{5, FailureReason::kPeerLost, "x"}),
            R"({"type":"room_failed","room":5,"reason":"peer_lost","message":"x"})");
  const json h = json::parse(EncodeMessage(MakeHello("prefill", "abc")));
  EXPECT_EQ(h["protocol"], kBootstrapProtocolVersion);
  EXPECT_EQ(h["layout"]["groups"][0]["dtype"], "BF16");
  EXPECT_EQ(h["layout"]["page_size"], 16);
}

TEST(BootstrapMessages, FailureReasonNames) {
  const std::pair<FailureReason, const char*> kNames[] = {
      {FailureReason::kBootstrapTimeout, "bootstrap_timeout"},
      {FailureReason::kTransferTimeout, "transfer_timeout"},
      {FailureReason::kPeerLost, "peer_lost"},
      {FailureReason::kAborted, "aborted"},
      {FailureReason::kRejected, "rejected"}};
  for (const auto& [r, name] : kNames) {
    EXPECT_STREQ(FailureReasonName(r), name);
    FailureReason back = FailureReason::kAborted;
    ASSERT_TRUE(ParseFailureReason(name, &back)) << name;
    EXPECT_EQ(back, r);
  }
  FailureReason out = FailureReason::kRejected;
  EXPECT_FALSE(ParseFailureReason("kv_full", &out));
  EXPECT_FALSE(ParseFailureReason("", &out));
  EXPECT_FALSE(ParseFailureReason("PEER_LOST", &out));
  EXPECT_EQ(out, FailureReason::kRejected);
}

TEST(BootstrapMessages, NewInstanceIdIs16HexDigitsAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewInstanceId();
    ASSERT_EQ(id.size(), 16u) << id;
    for (char c : id) ASSERT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

void ExpectRejected(std::string_view payload, const std::string& needle = "") {
  StatusOr<Message> m = DecodeMessage(payload);
  ASSERT_FALSE(m.ok()) << payload.substr(0, 200);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status().ToString();
  EXPECT_FALSE(m.status().message().empty());
  if (!needle.empty()) {
    EXPECT_NE(m.status().message().find(needle), std::string::npos)
        << "message does not name " << needle << ": " << m.status().message();
  }
}

TEST(BootstrapMessages, GarbageIsInvalidArgument) {
  ExpectRejected("");
  ExpectRejected("{");
  ExpectRejected("null");
  ExpectRejected("[]");
  ExpectRejected("\"hello\"");
  ExpectRejected("\xff\xfe\x00\x01");
  ExpectRejected(std::string("{\"type\":\"heartbeat\",\"seq\":1}\0", 29));
  ExpectRejected("{}", "type");
  ExpectRejected(R"({"type":5})", "type");
  ExpectRejected(R"({"type":"room_abort","room":1})", "room_abort");
  ExpectRejected(R"({"type":"heartbeat","seq":1e400})");
  ExpectRejected(R"({"type":"heartbeat","seq":18446744073709551616})", "seq");
  ExpectRejected(R"({"type":"heartbeat","seq":"\ud800"})");
  ExpectRejected(std::string(200000, '['));
  ExpectRejected(R"({"type":"heartbeat","seq":[[[[[[[[[[1]]]]]]]]]]})", "deeper");
  // Every proper prefix of every valid message (a truncated frame).
  for (const Message& m : SampleMessages()) {
    const std::string wire = EncodeMessage(m);
    for (size_t n = 0; n < wire.size(); ++n) ExpectRejected(std::string_view(wire).substr(0, n));
  }
}

// Each case: take a valid message's JSON, change one thing, expect the
// error to name the field.
TEST(BootstrapMessages, WrongFieldsAreNamed) {
  struct Case {
    Message base;
    std::function<void(json&)> edit;
    std::string field;
  };
  const Message hello = MakeHello("decode", "abc");
  const Message ready = RoomReady{1, 100, 0, {1, 2, 3}};
  const Message done = RoomDone{1, 5, -0.5f, {{5, -0.5f}}, 10, 2, false, ""};
  const Message failed = RoomFailed{1, FailureReason::kAborted, "m"};
  const std::vector<Case> cases = {
      {hello, [](json& j) { j["protocol"] = kBootstrapProtocolVersion + 1; }, "\"protocol\""},
      {hello, [](json& j) { j.erase("protocol"); }, "\"protocol\""},
      {hello, [](json& j) { j["instance_id"] = ""; }, "\"instance_id\""},
      {hello, [](json& j) { j["role"] = "router"; }, "\"role\""},
      {hello, [](json& j) { j.erase("model"); }, "\"model\""},
      {hello, [](json& j) { j["model"] = 7; }, "\"model\""},
      {hello, [](json& j) { j["layout"] = "16"; }, "\"layout\""},
      {hello, [](json& j) { j["layout"]["page_size"] = 0; }, "\"layout.page_size\""},
      {hello, [](json& j) { j["layout"]["page_size"] = 16.0; }, "\"layout.page_size\""},
      {hello, [](json& j) { j["layout"]["groups"] = json::array(); }, "\"layout.groups\""},
      {hello, [](json& j) { j["layout"]["groups"][0] = 3; }, "\"layout.groups[0]\""},
      {hello, [](json& j) { j["layout"]["groups"][0]["dtype"] = "I32"; },
       "\"layout.groups[0].dtype\""},
      {hello, [](json& j) { j["layout"]["groups"][0]["dtype"] = "bf16"; },
       "\"layout.groups[0].dtype\""},
      {hello, [](json& j) { j["layout"]["groups"][0]["num_layers"] = -2; },
       "\"layout.groups[0].num_layers\""},
      {hello, [](json& j) { j["layout"]["groups"][0]["head_dim"] = 4294967296; },
       "\"layout.groups[0].head_dim\""},
      {hello, [](json& j) { j["layout"]["groups"][0]["has_v"] = 1; }, "\"layout.groups[0].has_v\""},
      {hello, [](json& j) { j["layout"]["groups"][0]["sliding_window"] = -1; },
       "\"layout.groups[0].sliding_window\""},
      {hello, [](json& j) { j["layout"]["groups"][0]["name"] = ""; }, "\"layout\""},
      {hello, [](json& j) { j["layout"]["groups"].push_back(j["layout"]["groups"][0]); },
       "duplicate"},
      {hello, [](json& j) { j["transport_descriptor"] = "AAA"; }, "\"transport_descriptor\""},
      {hello, [](json& j) { j["transport_descriptor"] = "AB=="; }, "\"transport_descriptor\""},
      {hello, [](json& j) { j["transport_descriptor"] = "****"; }, "\"transport_descriptor\""},
      {ready, [](json& j) { j["room"] = -1; }, "\"room\""},
      {ready, [](json& j) { j["room"] = 1.5; }, "\"room\""},
      {ready, [](json& j) { j["prompt_tokens"] = 0; }, "\"prompt_tokens\""},
      {ready, [](json& j) { j["first_page"] = -1; }, "\"first_page\""},
      {ready, [](json& j) { j["dst_pages"][1] = -1; }, "\"dst_pages[1]\""},
      {ready, [](json& j) { j["dst_pages"][2] = 1073741824; }, "\"dst_pages[2]\""},
      {ready, [](json& j) { j["dst_pages"][0] = "1"; }, "\"dst_pages[0]\""},
      {ready, [](json& j) { j["dst_pages"] = json::object(); }, "\"dst_pages\""},
      {done, [](json& j) { j["first_token"] = 1.5; }, "\"first_token\""},
      {done, [](json& j) { j["first_token"] = -1; }, "\"first_token\""},
      {done, [](json& j) { j["logprob"] = 1e300; }, "\"logprob\""},
      {done, [](json& j) { j["logprob"] = "-Infinity"; }, "\"logprob\""},
      {done, [](json& j) { j["logprob"] = nullptr; }, "\"logprob\""},
      {done, [](json& j) { j["top_logprobs"][0]["token"] = "5"; }, "\"top_logprobs[0].token\""},
      {done, [](json& j) { j["top_logprobs"][0] = json::array(); }, "\"top_logprobs[0]\""},
      {done, [](json& j) { j["cached_tokens"] = 11; }, "\"cached_tokens\""},
      {done, [](json& j) { j["finished"] = "false"; }, "\"finished\""},
      {done, [](json& j) { j.erase("finish_reason"); }, "\"finish_reason\""},
      {failed, [](json& j) { j["reason"] = "kv_full"; }, "\"reason\""},
      {failed, [](json& j) { j["message"] = json::array(); }, "\"message\""},
      {Heartbeat{1}, [](json& j) { j["seq"] = true; }, "\"seq\""},
  };
  for (const Case& c : cases) {
    json j = json::parse(EncodeMessage(c.base));
    c.edit(j);
    SCOPED_TRACE(j.dump());
    ExpectRejected(j.dump(), c.field);
  }
  // Unknown extra fields are ignored (a newer peer may add some).
  json j = json::parse(EncodeMessage(ready));
  j["future_field"] = {1, 2};
  EXPECT_TRUE(DecodeMessage(j.dump()).ok());
}

// Checks the codec's contract on any input: no throw, InvalidArgument with
// a message, or a message that re-encodes canonically.
void CheckDecodeContract(std::string_view payload) {
  StatusOr<Message> m = DecodeMessage(payload);
  if (!m.ok()) {
    ASSERT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    ASSERT_FALSE(m.status().message().empty());
    return;
  }
  const std::string again = EncodeMessage(*m);
  StatusOr<Message> m2 = DecodeMessage(again);
  ASSERT_TRUE(m2.ok()) << again << " " << m2.status().ToString();
  ASSERT_EQ(EncodeMessage(*m2), again);
}

// A random value of a random JSON type, some at the edges of our ranges.
json RandomValue(std::mt19937_64& rng) {
  switch (rng() % 14) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:
      return -1;
    case 3:
      return 0;
    case 4:
      return 1.5;
    case 5:
      return std::numeric_limits<uint64_t>::max();
    case 6:
      return std::numeric_limits<int64_t>::min();
    case 7:
      return 2147483648LL;
    case 8:
      return "";
    case 9:
      return "-inf";
    case 10:
      return json::array({1, 2});
    case 11:
      return json::object();
    case 12:
      return 1073741824;
    default:
      return static_cast<int64_t>(rng() % 100);
  }
}

// Picks a random node of j (by walking down) and edits it.
void MutateJson(json& j, std::mt19937_64& rng) {
  json* node = &j;
  while (node->is_structured() && !node->empty() && rng() % 3 != 0) {
    auto it = node->begin();
    std::advance(it, static_cast<long>(rng() % node->size()));
    node = &*it;
  }
  switch (rng() % 4) {
    case 0:
      *node = RandomValue(rng);
      break;
    case 1:
      if (node->is_object() && !node->empty()) {
        auto it = node->begin();
        std::advance(it, static_cast<long>(rng() % node->size()));
        node->erase(it);
      }
      break;
    case 2:
      if (node->is_array()) node->push_back(RandomValue(rng));
      break;
    default:
      if (node->is_object()) (*node)["type"] = RandomValue(rng);
      break;
  }
}

TEST(BootstrapMessages, RandomMutationsNeverCrash) {
  std::mt19937_64 rng(20261202);  // fixed: deterministic
  const std::vector<Message> samples = SampleMessages();
  for (int i = 0; i < 20000; ++i) {
    const std::string wire = EncodeMessage(samples[rng() % samples.size()]);
    std::string input;
    if (i % 2 == 0) {
      json j = json::parse(wire);
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) MutateJson(j, rng);
      input = j.dump();
    } else {
      input = wire;
      for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) {
        const size_t pos = rng() % (input.size() + 1);
        switch (rng() % 4) {
          case 0:
            if (pos < input.size()) input[pos] = static_cast<char>(rng());
            break;
          case 1:
            input.insert(pos, 1, "{}[]\",:0-e\\"[rng() % 11]);
            break;
          case 2:
            if (pos < input.size()) input.erase(pos, 1 + rng() % 8);
            break;
          default:
            input.resize(pos);
            break;
        }
      }
    }
    SCOPED_TRACE(input);
    CheckDecodeContract(input);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace strata::disagg
