// The Files API's store kept on disk (serve/files_api.h, serve --files-dir): what one process
// keeps the next reads back, a removed file stays removed, one process at a time, and what it
// cannot read back it names instead of dropping.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "serve/files_api.h"
#include "test_support.h"

namespace sy::serve {
namespace {

TEST(FileStoreTest, KeptFilesOutliveTheStore) {
  const std::string dir = testing::TempDirectory("files_store_kept");
  std::string kept_id, removed_id;
  {
    auto store = FileStore::Open(1 << 20, dir);
    ASSERT_TRUE(store.ok()) << store.status().message();
    auto kept = store.value()->Add("a.jsonl", "batch", "line one\nline two\n", 100);
    auto removed = store.value()->Add("b.jsonl", "batch_output", "x", 101);
    ASSERT_TRUE(kept.ok() && removed.ok());
    kept_id = kept.value()->id;
    removed_id = removed.value()->id;
    EXPECT_TRUE(store.value()->Remove(removed_id));
    // One process (one store) at a time.
    auto second = FileStore::Open(1 << 20, dir);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.status().message().find("another process keeps its files there"),
              std::string::npos)
        << second.status().message();
    EXPECT_EQ(store.value()->batches_directory(), dir + "/batches");
  }
  // A crash between a content and its description leaves a content alone: not a file.
  std::ofstream(dir + "/files/file-orphan.content") << "half";
  auto store = FileStore::Open(1 << 20, dir);
  ASSERT_TRUE(store.ok()) << store.status().message();
  auto file = store.value()->Get(kept_id);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->filename, "a.jsonl");
  EXPECT_EQ(file->purpose, "batch");
  EXPECT_EQ(file->created_at, 100);
  EXPECT_EQ(file->content, "line one\nline two\n");
  EXPECT_EQ(store.value()->Get(removed_id), nullptr);
  EXPECT_EQ(store.value()->List("").size(), 1u);
  // The budget counts what was read back.
  auto too_big = store.value()->Add("c", "batch", std::string((1 << 20) - 5, 'x'), 102);
  EXPECT_FALSE(too_big.ok());
}

TEST(FileStoreTest, WhatCannotBeReadBackIsNamed) {
  const std::string dir = testing::TempDirectory("files_store_damaged");
  std::string id;
  {
    auto store = FileStore::Open(1 << 20, dir);
    ASSERT_TRUE(store.ok()) << store.status().message();
    id = store.value()->Add("a.jsonl", "batch", std::string(1000, 'x'), 1).value()->id;
  }
  // More kept than the budget allows.
  auto small = FileStore::Open(100, dir);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("its files hold 1000 bytes"), std::string::npos)
      << small.status().message();
  // A content cut short.
  std::ofstream(dir + "/files/" + id + ".content") << "short";
  auto cut = FileStore::Open(1 << 20, dir);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find(id + ".json: its content holds 5 bytes where it says 1000"),
            std::string::npos)
      << cut.status().message();
  // A description that is not one.
  std::ofstream(dir + "/files/" + id + ".json") << "{\"id\": 7}";
  auto damaged = FileStore::Open(1 << 20, dir);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find(id + ".json: not a file description"),
            std::string::npos)
      << damaged.status().message();
}

TEST(FileStoreTest, AMessageBatchsFilesAreNotTheFilesApis) {
  // Counted and kept by the store, but neither listed nor served by /v1/files.
  FileStore store(1 << 20);
  auto requests = store.Add("msgbatch_1_requests.jsonl", kMessageBatchRequestsPurpose, "x\n", 1);
  auto results = store.Add("msgbatch_1_results.jsonl", kMessageBatchResultsPurpose, "y\n", 2);
  auto upload = store.Add("a.jsonl", "batch", "z\n", 3);
  ASSERT_TRUE(requests.ok() && results.ok() && upload.ok());
  const auto listed = nlohmann::json::parse(FilesRequest(store, "GET", "", "", "", "", 0).body);
  ASSERT_EQ(listed["data"].size(), 1u);
  EXPECT_EQ(listed["data"][0]["id"], upload.value()->id);
  for (const auto& hidden : {requests.value()->id, results.value()->id})
    for (const char* method : {"GET", "DELETE"})
      for (const char* tail : {"", "/content"}) {
        const ApiReply reply = FilesRequest(store, method, "/" + hidden + tail, "", "", "", 0);
        EXPECT_EQ(reply.error.status, 404) << method << " " << hidden << tail;
      }
  EXPECT_NE(store.Get(results.value()->id), nullptr);  // still kept
  EXPECT_EQ(store.List("").size(), 3u);
}

}  // namespace
}  // namespace sy::serve
