#include "transfer/wire.h"

#include <algorithm>
#include <cstring>

#include <xxhash.h>

namespace sy::transfer {

uint64_t Checksum(Header h, std::initializer_list<std::pair<const void*, size_t>> parts) {
  h.checksum = 0;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, &h, sizeof(h));
  for (const auto& [data, size] : parts)
    XXH3_64bits_update(state, data, size);
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

Result<MessageView> ParseMessage(const uint8_t* data, size_t size, bool verify) {
  MessageView m;
  if (size < sizeof(Header))
    return Status::Errorf("a transfer message of {} bytes is shorter than its header", size);
  std::memcpy(&m.header, data, sizeof(Header));
  const Header& h = m.header;
  if (h.magic != kMagic) return Status::Errorf("not a transfer message (magic {:#x})", h.magic);
  if (h.id_length == 0 || h.id_length > kMaxIdLength)
    return Status::Errorf("request id length {} outside [1, {}]", h.id_length, kMaxIdLength);
  const size_t rest = size - sizeof(Header);
  if (h.id_length > rest)
    return Status::Errorf("request id of {} bytes in a message with {} after its header",
                          h.id_length, rest);
  m.id = std::string_view(reinterpret_cast<const char*>(data) + sizeof(Header), h.id_length);
  if (h.payload_bytes != rest - h.id_length)
    return Status::Errorf("request {}: payload_bytes {} but {} bytes follow the id", m.id,
                          h.payload_bytes, rest - h.id_length);
  if (h.kind == kRows) {
    if (h.first < 0 || h.count <= 0 || h.layers <= 0 || h.row_bytes <= 0)
      return Status::Errorf("request {}: rows [{}, +{}) of {} layers × {} bytes", m.id, h.first,
                            h.count, h.layers, h.row_bytes);
    const unsigned __int128 expected = static_cast<unsigned __int128>(h.count) *
                                       static_cast<uint64_t>(h.layers) *
                                       static_cast<uint64_t>(h.row_bytes);
    if (expected != h.payload_bytes)
      return Status::Errorf("request {}: {} rows of {} layers × {} bytes in a payload of {}", m.id,
                            h.count, h.layers, h.row_bytes, h.payload_bytes);
    m.payload = data + sizeof(Header) + h.id_length;
  } else if (h.kind == kDone) {
    if (h.count < 0)
      return Status::Errorf("request {}: a closing message of {} rows", m.id, h.count);
    m.payload = data + sizeof(Header) + h.id_length;
  } else {
    return Status::Errorf("request {}: unknown message kind {}", m.id, h.kind);
  }
  m.checksum_ok = verify && Checksum(h, {{data + sizeof(Header), rest}}) == h.checksum;
  return m;
}

std::vector<uint8_t> EncodeDrafts(const HandoffDrafts& drafts) {
  const size_t count = std::min(drafts.tokens.size(), drafts.distributions.size());
  if (count == 0) return {};
  size_t bytes = 4;
  for (size_t i = 0; i < count; ++i)
    bytes += 8 + drafts.distributions[i].tokens.size() * (sizeof(int32_t) + sizeof(double));
  std::vector<uint8_t> out(bytes);
  size_t at = 0;
  auto put = [&out, &at](const void* value, size_t size) {
    if (size > 0) std::memcpy(out.data() + at, value, size);
    at += size;
  };
  const auto count32 = static_cast<uint32_t>(count);
  put(&count32, 4);
  for (size_t i = 0; i < count; ++i) {
    const TokenDistribution& q = drafts.distributions[i];
    const auto n = static_cast<uint32_t>(q.tokens.size());
    put(&drafts.tokens[i], 4);
    put(&n, 4);
    put(q.tokens.data(), n * sizeof(int32_t));
    put(q.probs.data(), n * sizeof(double));
  }
  return out;
}

Result<HandoffDrafts> ParseDrafts(const uint8_t* data, size_t size) {
  HandoffDrafts drafts;
  if (size == 0) return drafts;
  size_t at = 0;
  auto take = [&](void* value, size_t bytes) {
    if (bytes > size - at) return false;
    if (bytes > 0) std::memcpy(value, data + at, bytes);
    at += bytes;
    return true;
  };
  uint32_t count = 0;
  if (!take(&count, 4)) return Status::Errorf("MTP drafts: {} bytes hold no count", size);
  for (uint32_t i = 0; i < count; ++i) {
    int32_t token = 0;
    uint32_t n = 0;
    if (!take(&token, 4) || !take(&n, 4))
      return Status::Errorf("MTP drafts: draft {} of {} runs past the {} bytes", i, count, size);
    // 12 bytes per entry: n is checked against what is left before anything is allocated.
    if (n > (size - at) / 12)
      return Status::Errorf("MTP drafts: draft {} names {} entries, more than {} bytes hold", i, n,
                            size - at);
    TokenDistribution q;
    q.tokens.resize(n);
    q.probs.resize(n);
    take(q.tokens.data(), n * sizeof(int32_t));
    take(q.probs.data(), n * sizeof(double));
    drafts.tokens.push_back(token);
    drafts.distributions.push_back(std::move(q));
  }
  if (at != size) return Status::Errorf("MTP drafts: {} bytes past the last draft", size - at);
  return drafts;
}

}  // namespace sy::transfer
