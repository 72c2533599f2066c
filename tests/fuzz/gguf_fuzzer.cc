// libFuzzer target: the GGUF reader must reject any byte string cleanly — no crash, no
// out-of-bounds read, no tensor outside the buffer — and whatever it accepts must dequantize
// without reading past its tensor's bytes (ASan watches the reads), and go through the tokenizer
// and model conversions with an error or a result, never a crash.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "model/gguf.h"
#include "model/gguf_model.h"
#include "tensor/ggml_quants.h"
#include "tokenizer/gguf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes on the heap, so ASan catches a read one past the end.
  std::vector<uint8_t> bytes(data, data + size);
  auto parsed = sy::GgufFile::Parse(bytes.data(), bytes.size(), "fuzz");
  if (!parsed.ok()) return 0;
  const sy::GgufFile& file = parsed.value();
  for (const auto& tensor : file.tensors()) {
    if (file.data_offset() + tensor.offset + tensor.byte_size > size) std::abort();
    if (tensor.elements > (1 << 16)) continue;  // big but valid: bounds were checked above
    const auto traits = sy::GgmlTypeInfo(tensor.type);
    if (!traits || !traits->dequantizable) continue;
    std::vector<float> out(tensor.elements);
    if (!sy::DequantizeGgml(tensor.type, file.TensorData(tensor), tensor.elements, out.data()).ok())
      std::abort();
  }
  for (const auto& [key, value] : file.metadata())
    (void)value.AsFloat();
  (void)sy::GgufTokenizerJson(file);
  (void)sy::GgufTokenizerConfig(file);
  auto config = sy::GgufModelConfig(file);
  if (config.ok()) (void)sy::GgufCheckpoint(file, config.value());
  return 0;
}
