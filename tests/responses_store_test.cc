// The front's store: least-recently-used eviction within its byte budget, replacement, updates,
// deletion, thread claims, and the input-items list's order, paging and parameter errors. No
// model.
#include "serve/responses_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "serve/responses_api.h"

namespace sy::serve {
namespace {

using json = nlohmann::ordered_json;

StoredResponse Entry(size_t text_bytes) {
  return {{{"id", "r"}, {"text", std::string(text_bytes, 'x')}}, json::array(), nullptr};
}

TEST(ResponsesStore, EvictsTheLeastRecentlyUsedBeyondItsBudget) {
  ResponsesStore store(3000);
  store.Put("a", Entry(900));
  store.Put("b", Entry(900));
  store.Put("c", Entry(900));
  EXPECT_EQ(store.size(), 3u);
  EXPECT_LE(store.bytes(), 3000u);
  ASSERT_NE(store.Get("a"), nullptr);  // now a is the most recently used: b goes first
  store.Put("d", Entry(900));
  EXPECT_EQ(store.Get("b"), nullptr);
  EXPECT_NE(store.Get("a"), nullptr);
  EXPECT_NE(store.Get("c"), nullptr);
  EXPECT_NE(store.Get("d"), nullptr);
  EXPECT_LE(store.bytes(), 3000u);
  EXPECT_EQ(store.evictions(), 1);
  // Replacing an entry frees the old one's bytes.
  const size_t before = store.bytes();
  store.Put("d", Entry(100));
  EXPECT_EQ(store.bytes(), before - 800);
  EXPECT_EQ(store.Get("d")->response["text"].get<std::string>().size(), 100u);
  // An entry larger than the whole budget is not kept, and evicts nothing.
  store.Put("huge", Entry(5000));
  EXPECT_EQ(store.Get("huge"), nullptr);
  EXPECT_EQ(store.size(), 3u);
  EXPECT_TRUE(store.Erase("a"));
  EXPECT_FALSE(store.Erase("a"));
  EXPECT_EQ(store.Get("a"), nullptr);
  EXPECT_EQ(store.size(), 2u);
  // What a reader holds outlives its eviction.
  auto held = store.Get("c");
  store.Put("e", Entry(2500));
  EXPECT_EQ(store.Get("c"), nullptr);
  EXPECT_EQ(held->response["text"].get<std::string>().size(), 900u);
}

TEST(ResponsesStore, InputItemsListNewestFirstInPages) {
  StoredResponse stored;
  stored.context = json::array();
  for (int i = 0; i < 5; ++i)
    stored.context.push_back({{"id", "msg_" + std::to_string(i)}, {"type", "message"}});
  auto ids = [](const std::string& body) {
    const json list = json::parse(body);
    std::string out;
    for (const json& item : list["data"])
      out += item["id"].get<std::string>().substr(4);
    return out + (list["has_more"] == true ? "+" : "");
  };
  ApiError error;
  EXPECT_EQ(ids(InputItemsBody(stored, "", &error)), "43210");
  EXPECT_EQ(ids(InputItemsBody(stored, "order=asc&limit=2", &error)), "01+");
  EXPECT_EQ(ids(InputItemsBody(stored, "order=asc&limit=2&after=msg_1", &error)), "23+");
  EXPECT_EQ(ids(InputItemsBody(stored, "limit=3&after=msg_2", &error)), "10");
  const json first = json::parse(InputItemsBody(stored, "limit=1", &error));
  EXPECT_EQ(first["object"], "list");
  EXPECT_EQ(first["first_id"], "msg_4");
  EXPECT_EQ(first["last_id"], "msg_4");
  for (const char* bad : {"limit=0", "limit=101", "limit=x", "order=up", "after=msg_9"}) {
    error = {};
    EXPECT_EQ(InputItemsBody(stored, bad, &error), "") << bad;
    EXPECT_EQ(error.status, 400) << bad;
    EXPECT_EQ(error.param, std::string(bad).substr(0, std::string(bad).find('='))) << bad;
  }
}

}  // namespace
TEST(ResponsesStore, UpdateChangesAnEntryInPlaceAndKeepsTheBudget) {
  ResponsesStore store(3000);
  store.Put("a", Entry(900));
  store.Put("b", Entry(900));
  EXPECT_FALSE(store.Update("none", [](StoredResponse&) {}));
  // A conversation's items appended: the bytes follow, and a reader keeps the old value.
  auto before = store.Get("a");
  ASSERT_TRUE(store.Update("a", [](StoredResponse& e) { e.context.push_back("one more"); }));
  EXPECT_EQ(before->context.size(), 0u);
  EXPECT_EQ(store.Get("a")->context.size(), 1u);
  EXPECT_EQ(store.bytes(),
            2 * (Entry(900).response.dump().size() + 3) + 10);  // "[]" → ["one more"]
  // Grown beyond the budget, it evicts the least recently used other first.
  ASSERT_TRUE(
      store.Update("a", [](StoredResponse& e) { e.response["text"] = std::string(2500, 'y'); }));
  EXPECT_EQ(store.Get("b"), nullptr);
  EXPECT_NE(store.Get("a"), nullptr);
  EXPECT_LE(store.bytes(), 3000u);
  // Beyond the whole budget, it goes as well (as Put would not keep it).
  ASSERT_TRUE(
      store.Update("a", [](StoredResponse& e) { e.response["text"] = std::string(4000, 'z'); }));
  EXPECT_EQ(store.Get("a"), nullptr);
  EXPECT_EQ(store.bytes(), 0u);
}

TEST(ResponsesStore, AThreadReplyIsContinuedOnce) {
  ResponsesStore store(1 << 20);
  EXPECT_EQ(store.ClaimContinuation("msg_a"), ResponsesStore::Claim::kNotFound);
  store.Put("msg_a", StoredResponse{});
  EXPECT_EQ(store.ClaimContinuation("msg_a"), ResponsesStore::Claim::kClaimed);
  EXPECT_EQ(store.ClaimContinuation("msg_a"), ResponsesStore::Claim::kInFlight);
  // A failed continuation frees it for another try; a finished one closes it.
  store.ReleaseContinuation("msg_a", false);
  EXPECT_EQ(store.ClaimContinuation("msg_a"), ResponsesStore::Claim::kClaimed);
  store.ReleaseContinuation("msg_a", true);
  EXPECT_EQ(store.ClaimContinuation("msg_a"), ResponsesStore::Claim::kContinued);
  // Deleted or evicted, it is gone, claims and all.
  store.Erase("msg_a");
  EXPECT_EQ(store.ClaimContinuation("msg_a"), ResponsesStore::Claim::kNotFound);
  store.Put("msg_a", StoredResponse{});
  EXPECT_EQ(store.ClaimContinuation("msg_a"), ResponsesStore::Claim::kClaimed);
}

// A store kept in a directory: what one process stored, changed, deleted and continued, the next
// reads back (its order of use too); the journal is rewritten as it grows; a last line cut by a
// crash is dropped, damage before it is an error naming the line; one process at a time.
TEST(ResponsesStore, AStoreInADirectoryOutlivesItsProcess) {
  const std::string dir = ::testing::TempDir() + "/store-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  {
    auto opened = ResponsesStore::Open(1 << 20, dir);
    ASSERT_TRUE(opened.ok()) << opened.status().message();
    ResponsesStore& store = **opened;
    store.Put("a", Entry(100));
    StoredResponse with_events = Entry(50);
    with_events.events = std::make_shared<const std::vector<std::string>>(
        std::vector<std::string>{"event: one\n\n", "event: two\n\n"});
    store.Put("b", with_events);
    store.Put("gone", Entry(10));
    EXPECT_TRUE(store.Erase("gone"));
    EXPECT_TRUE(store.Update("a", [](StoredResponse& e) { e.context.push_back("item"); }));
    ASSERT_EQ(store.ClaimContinuation("b"), ResponsesStore::Claim::kClaimed);
    store.ReleaseContinuation("b", true);
    // A second process (a second open while this one holds the directory) is refused.
    auto second = ResponsesStore::Open(1 << 20, dir);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.status().message().find("another process"), std::string::npos);
  }
  {
    auto opened = ResponsesStore::Open(1 << 20, dir);
    ASSERT_TRUE(opened.ok()) << opened.status().message();
    ResponsesStore& store = **opened;
    EXPECT_EQ(store.size(), 2u);
    EXPECT_EQ(store.Get("gone"), nullptr);
    auto a = store.Get("a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->response, Entry(100).response);
    EXPECT_EQ(a->context, json::array({"item"}));
    auto b = store.Get("b");
    ASSERT_NE(b, nullptr);
    ASSERT_NE(b->events, nullptr);
    EXPECT_EQ(*b->events, (std::vector<std::string>{"event: one\n\n", "event: two\n\n"}));
    EXPECT_EQ(store.ClaimContinuation("b"), ResponsesStore::Claim::kContinued);
    // Growth past twice what is live rewrites the journal: it stays near the live size.
    for (int i = 0; i < 400; ++i)
      store.Put("churn", Entry(10000));
    const auto journal = std::filesystem::file_size(dir + "/responses.jsonl");
    EXPECT_LT(journal, 2 * store.bytes() + (1 << 20) + 20000);
  }
  {
    // A smaller budget on the way back (room for the 10 kB entry only): the least recently
    // used are dropped.
    auto opened = ResponsesStore::Open(10100, dir);
    ASSERT_TRUE(opened.ok()) << opened.status().message();
    EXPECT_EQ((*opened)->size(), 1u);
    EXPECT_NE((*opened)->Get("churn"), nullptr);  // the most recent
    EXPECT_LE((*opened)->bytes(), 10100u);
  }
  // A crash mid-write leaves a cut last line: dropped. Damage before the last line is an error.
  { std::ofstream(dir + "/responses.jsonl", std::ios::app) << R"({"op": "put", "id": "cut", "re)"; }
  {
    auto opened = ResponsesStore::Open(1 << 20, dir);
    ASSERT_TRUE(opened.ok()) << opened.status().message();
    EXPECT_EQ((*opened)->Get("cut"), nullptr);
    EXPECT_NE((*opened)->Get("churn"), nullptr);
  }
  for (const char* bad : {"not json", R"({"op": "put", "id": "x", "events": [1]})",
                          R"({"op": 7, "id": "x"})", R"({"op": "rename", "id": "x"})"}) {
    {
      std::ofstream out(dir + "/responses.jsonl", std::ios::trunc);
      out << bad << "\n"
          << R"({"op": "erase", "id": "x"})"
          << "\n";
    }
    auto damaged = ResponsesStore::Open(1 << 20, dir);
    ASSERT_FALSE(damaged.ok()) << bad;
    EXPECT_NE(damaged.status().message().find("responses.jsonl line 1"), std::string::npos)
        << damaged.status().message();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace sy::serve
