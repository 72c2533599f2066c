// The transfer's message format (transfer/kv_transfer.h): a 64-byte header, the request id, then
// a chunk's rows (or, closing a transfer, the MTP drafts); parsed here from untrusted bytes
// (fuzzed: tests/fuzz/transfer_fuzzer.cc). Little-endian hosts only (x86-64, AArch64), as the cache
// rows themselves are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "engine/handoff.h"

namespace sy::transfer {

constexpr uint32_t kMagic = 0x53594b56;  // "SYKV"
constexpr uint32_t kMaxIdLength = 1024;
enum Kind : uint32_t { kRows = 1, kDone = 2 };

struct Header {
  uint32_t magic = kMagic;
  uint32_t kind = 0;
  uint64_t token = 0;
  uint64_t checksum = 0;  // XXH3-64 of the whole message with this field zero
  int64_t first = 0;      // kRows: the first row; kDone: 0
  int64_t count = 0;      // kRows: rows in the message; kDone: rows in the whole transfer
  int32_t layers = 0, row_bytes = 0;
  int32_t first_token = 0;  // kDone
  uint32_t id_length = 0;
  uint64_t payload_bytes = 0;
};
static_assert(sizeof(Header) == 64);

// XXH3-64 of the header (its checksum field zero), then `parts`: what a message's bytes are.
uint64_t Checksum(Header h, std::initializer_list<std::pair<const void*, size_t>> parts);

struct MessageView {
  Header header;
  std::string_view id;
  const uint8_t* payload = nullptr;  // kRows: count · layers · row_bytes bytes; kDone: drafts
  bool checksum_ok = false;
};

// A closing message's payload, the MTP drafts: a uint32 count, then per draft its token (int32),
// the size n of its distribution (uint32), n tokens (int32) and n probabilities (f64). Empty
// without drafts.
std::vector<uint8_t> EncodeDrafts(const HandoffDrafts& drafts);
// Every size checked against the bytes there are (the engine checks tokens against its vocabulary).
Result<HandoffDrafts> ParseDrafts(const uint8_t* data, size_t size);

// A message's parts, every length checked against the bytes there are (overflow included); an
// error names what is wrong. With `verify`, the checksum is computed and its verdict reported.
Result<MessageView> ParseMessage(const uint8_t* data, size_t size, bool verify);

}  // namespace sy::transfer
