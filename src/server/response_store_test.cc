#include "server/response_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "server/openai_response.h"

namespace strata {
namespace {

using Json = nlohmann::ordered_json;

Json Response(const std::string& id, const std::string& text = "hi") {
  return Json{
      {"id", id},
      {"object", "response"},
      {"output", Json::array({Json{
                     {"id", "msg_" + id},
                     {"type", "message"},
                     {"role", "assistant"},
                     {"content", Json::array({Json{{"type", "output_text"}, {"text", text}}})}}})}};
}

Json Input(const std::string& text) {
  return Json::array({Json{{"type", "message"}, {"role", "user"}, {"content", text}}});
}

TEST(ResponseStore, KeepsResponsesConversationsAndItems) {
  ResponseStore store({});
  ASSERT_TRUE(store.Put("r1", Response("r1", "out"), Input("in")));
  EXPECT_EQ(store.Get("r1"), Response("r1", "out"));
  auto conv = store.Conversation("r1");
  ASSERT_TRUE(conv);
  ASSERT_EQ(conv->size(), 2u);
  EXPECT_EQ((*conv)[0], Input("in")[0]);
  EXPECT_EQ((*conv)[1]["id"], "msg_r1");
  EXPECT_EQ(store.InputItems("r1"), Input("in"));
  EXPECT_EQ(store.Item("msg_r1"), Response("r1", "out")["output"][0]);
  EXPECT_FALSE(store.Get("r2"));
  EXPECT_FALSE(store.Item("msg_r2"));
  EXPECT_TRUE(store.CheckIntegrity());
}

TEST(ResponseStore, DeleteRemovesTheResponseAndItsItems) {
  ResponseStore store({});
  store.Put("r1", Response("r1"), Input("a"));
  EXPECT_TRUE(store.Delete("r1"));
  EXPECT_FALSE(store.Delete("r1"));
  EXPECT_FALSE(store.Get("r1"));
  EXPECT_FALSE(store.Item("msg_r1"));
  EXPECT_EQ(store.stats().responses, 0);
  EXPECT_EQ(store.stats().bytes, 0);
  EXPECT_TRUE(store.CheckIntegrity());
}

TEST(ResponseStore, EvictsTheLeastRecentlyUsedByCount) {
  ResponseStore store({.max_items = 3, .max_bytes = 1 << 20});
  for (const char* id : {"r1", "r2", "r3"}) store.Put(id, Response(id), Input(id));
  ASSERT_TRUE(store.Get("r1"));  // r1 is now the most recent: r2 goes first
  store.Put("r4", Response("r4"), Input("r4"));
  EXPECT_TRUE(store.Get("r1"));
  EXPECT_FALSE(store.Get("r2"));
  EXPECT_FALSE(store.Item("msg_r2")) << "an evicted response's items go with it";
  EXPECT_TRUE(store.Get("r3"));
  EXPECT_TRUE(store.Get("r4"));
  // A lookup by item counts as a use too.
  ASSERT_TRUE(store.Item("msg_r1"));
  store.Put("r5", Response("r5"), Input("r5"));  // evicts r3 (r4 was read after it)
  EXPECT_FALSE(store.Get("r3"));
  EXPECT_TRUE(store.Get("r1"));
  const ResponseStore::Stats s = store.stats();
  EXPECT_EQ(s.responses, 3);
  EXPECT_EQ(s.evicted_max_items, 2);
  EXPECT_EQ(s.evicted_max_bytes, 0);
  EXPECT_TRUE(store.CheckIntegrity());
}

TEST(ResponseStore, EvictsToStayWithinTheByteBound) {
  const std::string big(1000, 'x');
  // Room for two of these, not three.
  const int64_t one = static_cast<int64_t>(2 + DumpJson(Response("r1", big)).size() +
                                           DumpJson(Input("r1")[0]).size() +
                                           DumpJson(Response("r1", big)["output"][0]).size());
  ResponseStore store({.max_items = 100, .max_bytes = 2 * one + one / 2});
  store.Put("r1", Response("r1", big), Input("r1"));
  EXPECT_EQ(store.stats().bytes, one) << "bytes are the serialised text kept";
  store.Put("r2", Response("r2", big), Input("r2"));
  store.Put("r3", Response("r3", big), Input("r3"));
  EXPECT_FALSE(store.Get("r1"));
  EXPECT_TRUE(store.Get("r2"));
  EXPECT_TRUE(store.Get("r3"));
  EXPECT_EQ(store.stats().evicted_max_bytes, 1);
  EXPECT_LE(store.stats().bytes, 2 * one + one / 2);
  // One larger than the whole bound is not kept, and evicts nothing.
  const std::string huge(4 * one, 'y');
  EXPECT_FALSE(store.Put("r4", Response("r4", huge), Input("r4")));
  EXPECT_FALSE(store.Get("r4"));
  EXPECT_TRUE(store.Get("r2"));
  EXPECT_EQ(store.stats().too_large, 1);
  EXPECT_TRUE(store.CheckIntegrity());
}

TEST(ResponseStore, ReplacingAnIdKeepsTheCountsRight) {
  ResponseStore store({});
  store.Put("r1", Response("r1", "a"), Input("a"));
  store.Put("r1", Response("r1", "bb"), Input("bb"));
  EXPECT_EQ(store.stats().responses, 1);
  EXPECT_EQ(store.Get("r1"), Response("r1", "bb"));
  EXPECT_TRUE(store.CheckIntegrity());
}

TEST(ResponseStore, AnItemHeldByTwoResponsesComesFromTheNewest) {
  // A conversation is flattened: the next response holds the previous one's
  // output item in its input. Deleting the older keeps the item reachable.
  ResponseStore store({});
  store.Put("r1", Response("r1"), Input("a"));
  Json input = Input("a");
  input.push_back(Response("r1")["output"][0]);
  input.push_back(Input("b")[0]);
  store.Put("r2", Response("r2"), input);
  ASSERT_TRUE(store.Delete("r1"));
  // The index pointed at r2 (newest), so the item survives r1.
  EXPECT_EQ(store.Item("msg_r1"), Response("r1")["output"][0]);
  EXPECT_TRUE(store.CheckIntegrity());
}

TEST(ResponseStore, DisabledKeepsNothing) {
  ResponseStore store({.max_items = 0});
  EXPECT_FALSE(store.enabled());
  EXPECT_FALSE(store.Put("r1", Response("r1"), Input("a")));
  EXPECT_FALSE(store.Get("r1"));
}

// Writers, readers and deleters at once: the bounds and the index hold
// throughout (the races themselves: this test is clean under -fsanitize=thread).
TEST(ResponseStore, ConcurrentUseKeepsTheInvariants) {
  ResponseStore store({.max_items = 50, .max_bytes = 20000});
  std::atomic<bool> stop{false};
  std::atomic<int64_t> found{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const std::string id = "r" + std::to_string(t) + "_" + std::to_string(i);
        store.Put(id, Response(id, std::string(i % 300, 'z')), Input(id));
        if (auto r = store.Get(id)) found += (*r)["id"] == id;
        if (i % 7 == 0) store.Delete("r" + std::to_string((t + 1) % 4) + "_" + std::to_string(i));
        store.Item("msg_r" + std::to_string(t) + "_" + std::to_string(i / 2));
        store.Conversation("r" + std::to_string(t) + "_" + std::to_string(i - 1));
      }
    });
  }
  threads.emplace_back([&] {
    while (!stop.load()) {
      const ResponseStore::Stats s = store.stats();
      EXPECT_LE(s.responses, 50);
      EXPECT_LE(s.bytes, 20000);
    }
  });
  for (int t = 0; t < 4; ++t) threads[t].join();
  stop = true;
  threads.back().join();
  EXPECT_TRUE(store.CheckIntegrity());
  EXPECT_GT(found.load(), 0);
  const ResponseStore::Stats s = store.stats();
  EXPECT_GT(s.evicted_max_items + s.evicted_max_bytes, 0);
}

}  // namespace
}  // namespace strata
