// The transfer of latent rows (src/transfer) between two UCX workers of this process: rows sent
// in chunks arrive whole and in place, early messages wait for the announcement, and what is
// not the announced request's — another token, a corrupted byte, another shape — is refused.
#include "transfer/kv_transfer.h"
#include "transfer/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

namespace sy::transfer {
namespace {

constexpr int64_t kLayers = 3, kRowBytes = 24;

// Rows [first, first + count) of every layer, layer-major, each byte naming its place.
std::vector<uint8_t> Chunk(int64_t first, int64_t count) {
  std::vector<uint8_t> data(static_cast<size_t>(kLayers * count * kRowBytes));
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t r = 0; r < count; ++r)
      for (int64_t b = 0; b < kRowBytes; ++b)
        data[static_cast<size_t>((l * count + r) * kRowBytes + b)] =
            static_cast<uint8_t>(l * 97 + (first + r) * 13 + b);
  return data;
}

// Received rows laid out as Chunk lays them out (for comparing).
std::vector<uint8_t> Flat(const ImportedRows& rows) {
  std::vector<uint8_t> out(static_cast<size_t>(rows.layers * rows.rows * rows.row_bytes));
  int64_t next = 0;
  for (const auto& c : rows.chunks) {
    EXPECT_EQ(c.first, next);
    next += c.count;
    for (int64_t l = 0; l < rows.layers; ++l)
      for (int64_t r = 0; r < c.count; ++r)
        std::memcpy(out.data() + ((l * rows.rows) + c.first + r) * rows.row_bytes,
                    c.rows + (l * c.count + r) * rows.row_bytes,
                    static_cast<size_t>(rows.row_bytes));
  }
  return out;
}

struct Pair {
  std::unique_ptr<Receiver> receiver;
  std::unique_ptr<Sender> sender;
  Pair() {
    auto r = Receiver::Start("127.0.0.1", 0);
    EXPECT_TRUE(r.ok()) << r.status().message();
    receiver = std::move(r.value());
    auto s = Sender::Start();
    EXPECT_TRUE(s.ok()) << s.status().message();
    sender = std::move(s.value());
  }
};

void SendAll(Outgoing& out, int64_t rows, int64_t chunk, int32_t first_token) {
  for (int64_t first = 0; first < rows; first += chunk) {
    const int64_t count = std::min(chunk, rows - first);
    out.Rows(first, count, kLayers, kRowBytes, Chunk(first, count));
  }
  out.Done(first_token, {});
}

TEST(TransferTest, ChunksArriveWholeAndInPlaceEvenBeforeTheAnnouncement) {
  Pair p;
  auto out = p.sender->Open(p.receiver->address(), "req-1", 0xfeed);
  SendAll(*out, 50, 16, 1234);  // sent before the receiver announces the request
  ASSERT_TRUE(out->Wait(30).ok());
  auto got = p.receiver->Wait("req-1", 0xfeed, kLayers, kRowBytes, 30, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->first_token, 1234);
  ASSERT_EQ(got->rows->rows, 50);
  EXPECT_EQ(Flat(*got->rows), Chunk(0, 50));
  EXPECT_EQ(p.receiver->stats().transfers, 1);
  EXPECT_EQ(p.sender->stats().transfers, 1);
  EXPECT_GT(p.receiver->stats().bytes, 50 * kLayers * kRowBytes);
}

// A large message (UCX's rendezvous protocol) may complete after the small closing one: the
// transfer is whole only when every row named by the closing message is in.
// The MTP drafts ride the closing message: tokens and distributions arrive as sent, bit for bit.
TEST(TransferTest, MtpDraftsArriveWithTheClosingMessage) {
  Pair p;
  auto out = p.sender->Open(p.receiver->address(), "req-d", 0xd0);
  HandoffDrafts drafts;
  drafts.tokens = {17, 4};
  drafts.distributions.push_back({{17, 3, 9}, {0.5, 0.25 + 1e-17, 0.25}});
  drafts.distributions.push_back({{4}, {1.0}});
  out->Rows(0, 5, kLayers, kRowBytes, Chunk(0, 5));
  out->Done(99, drafts);
  ASSERT_TRUE(out->Wait(30).ok());
  auto got = p.receiver->Wait("req-d", 0xd0, kLayers, kRowBytes, 30, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->first_token, 99);
  EXPECT_EQ(got->rows->drafts.tokens, drafts.tokens);
  ASSERT_EQ(got->rows->drafts.distributions.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got->rows->drafts.distributions[i].tokens, drafts.distributions[i].tokens);
    EXPECT_EQ(got->rows->drafts.distributions[i].probs, drafts.distributions[i].probs);
  }
  // Malformed draft payloads are named, never overread.
  const std::vector<uint8_t> bytes = EncodeDrafts(drafts);
  EXPECT_FALSE(ParseDrafts(bytes.data(), bytes.size() - 1).ok());
  EXPECT_FALSE(ParseDrafts(bytes.data(), 6).ok());
  EXPECT_TRUE(ParseDrafts(bytes.data(), 0).ok());
}

TEST(TransferTest, ALargeChunkOvertakenByTheClosingMessageIsWaitedFor) {
  Pair p;
  for (int i = 0; i < 3; ++i) {
    const std::string id = "big-" + std::to_string(i);
    auto out = p.sender->Open(p.receiver->address(), id, 11);
    SendAll(*out, 60000, 40000, 77);
    auto got = p.receiver->Wait(id, 11, kLayers, kRowBytes, 60, nullptr);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->rows->rows, 60000);
    EXPECT_EQ(Flat(*got->rows), Chunk(0, 60000));
  }
}

TEST(TransferTest, AnotherTokenIsRefusedAndTheAnnouncedOneAccepted) {
  Pair p;
  auto stranger = p.sender->Open(p.receiver->address(), "req-2", 7);
  SendAll(*stranger, 8, 8, 1);
  ASSERT_TRUE(stranger->Wait(30).ok());
  auto chosen = p.sender->Open(p.receiver->address(), "req-2", 8);
  SendAll(*chosen, 20, 8, 99);
  auto got = p.receiver->Wait("req-2", 8, kLayers, kRowBytes, 30, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->first_token, 99);
  EXPECT_EQ(Flat(*got->rows), Chunk(0, 20));
  EXPECT_EQ(p.receiver->stats().refused, 2);  // the stranger's rows and its closing message
}

TEST(TransferTest, ACorruptedByteFailsTheTransferByItsChecksum) {
  Pair p;
  CorruptNextMessagesForTest(1);
  auto out = p.sender->Open(p.receiver->address(), "req-3", 5);
  SendAll(*out, 40, 16, 3);
  auto got = p.receiver->Wait("req-3", 5, kLayers, kRowBytes, 30, nullptr);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("checksum"), std::string::npos) << got.status().message();
  // Sent again, it is accepted.
  auto again = p.sender->Open(p.receiver->address(), "req-3", 6);
  SendAll(*again, 40, 16, 3);
  auto second = p.receiver->Wait("req-3", 6, kLayers, kRowBytes, 30, nullptr);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(Flat(*second->rows), Chunk(0, 40));
}

TEST(TransferTest, RowsOfAnotherShapeAreRefusedNamingIt) {
  Pair p;
  auto out = p.sender->Open(p.receiver->address(), "req-4", 1);
  SendAll(*out, 4, 4, 0);
  auto got = p.receiver->Wait("req-4", 1, kLayers + 1, kRowBytes, 30, nullptr);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("do not fit"), std::string::npos) << got.status().message();
}

TEST(TransferTest, NothingArrivingEndsAtTheTimeoutOrTheCancellation) {
  Pair p;
  auto got = p.receiver->Wait("req-5", 1, kLayers, kRowBytes, 0.3, nullptr);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("no transfer"), std::string::npos);
  bool cancel = true;
  got = p.receiver->Wait("req-6", 1, kLayers, kRowBytes, 30, [&] { return cancel; });
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("cancelled"), std::string::npos);
}

TEST(TransferTest, SendingToNobodyFailsInsteadOfHanging) {
  auto receiver = Receiver::Start("127.0.0.1", 0);
  ASSERT_TRUE(receiver.ok());
  const std::string address = receiver.value()->address();
  receiver.value().reset();  // nobody listens there now
  auto sender = Sender::Start();
  ASSERT_TRUE(sender.ok());
  auto out = sender.value()->Open(address, "req-7", 1);
  SendAll(*out, 4, 4, 0);
  Status status = out->Wait(20);
  EXPECT_FALSE(status.ok());
}

}  // namespace
}  // namespace sy::transfer
