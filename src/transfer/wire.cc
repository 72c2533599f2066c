#include "transfer/wire.h"

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
    if (h.payload_bytes != 0 || h.count < 0)
      return Status::Errorf("request {}: a closing message with {} payload bytes, {} rows", m.id,
                            h.payload_bytes, h.count);
  } else {
    return Status::Errorf("request {}: unknown message kind {}", m.id, h.kind);
  }
  m.checksum_ok = verify && Checksum(h, {{data + sizeof(Header), rest}}) == h.checksum;
  return m;
}

}  // namespace sy::transfer
