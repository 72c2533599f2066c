// libFuzzer target: the Hugging Face int4 loader (model/hf_int4.h) on checkpoints whose tensors
// have fuzzed presence, dtypes, shapes and bytes, and config.json's quantization_config parser
// (and a Kimi K2.5 wrapper's text_config) on fuzzed text. Either must give an error or a result,
// never a crash or a read outside a tensor (ASan watches); whatever loads must decode and pack.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/hf_int4.h"
#include "model/safetensors.h"
#include "tensor/packed_matrix.h"

namespace {

struct Input {
  const uint8_t* data;
  size_t size, at = 0;
  uint8_t Byte() { return at < size ? data[at++] : 0; }
};

const sy::DType kDTypes[] = {sy::DType::kI32,  sy::DType::kI64, sy::DType::kF16,
                             sy::DType::kBF16, sy::DType::kF32, sy::DType::kU8};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  const uint8_t mode = in.Byte();
  if (mode & 0x80) {  // quantization_config text
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    const std::string config =
        R"({"model_type":"deepseek_v3","vocab_size":16,"hidden_size":128,"intermediate_size":128,)"
        R"("num_hidden_layers":1,"num_attention_heads":1,"num_key_value_heads":1,"kv_lora_rank":16,)"
        R"("qk_nope_head_dim":8,"qk_rope_head_dim":8,"v_head_dim":8,"quantization_config":)" +
        text + "}";
    (void)sy::ParseModelConfig(config, "fuzz");
    return 0;
  }
  if (mode & 0x40) {  // a Kimi K2.5 wrapper's fields (text_config, its quantization_config)
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    auto parsed = sy::ParseModelConfig(R"({"model_type":"kimi_k25",)" + text + "}", "fuzz");
    if (!parsed.ok() && parsed.status().message().empty()) std::abort();
    return 0;
  }
  sy::Int4Config config;
  config.format = static_cast<sy::Int4Format>(1 + mode % 3);
  config.symmetric = (mode >> 2) & 1;
  config.gptq_zeros_minus_one = (mode >> 3) & 1;
  const int64_t rows = 8 * (1 + in.Byte() % 4), cols = 128 * (1 + in.Byte() % 2);
  const std::string module = "m";
  const std::vector<std::string> names = sy::Int4TensorNames(config, module);
  std::vector<sy::TensorToWrite> tensors;
  std::vector<std::string> sources;
  for (const std::string& name : names) {
    const uint8_t presence = in.Byte();
    if (presence % 8 == 0) continue;  // missing
    sy::TensorToWrite t;
    t.name = name;
    t.dtype = kDTypes[in.Byte() % 6];
    // A plausible shape, each dimension nudged by -1..+2 or halved now and then.
    const int64_t dims = 1 + in.Byte() % 2;
    for (int64_t d = 0; d < dims; ++d) {
      const uint8_t choice = in.Byte();
      int64_t extent = choice % 2 ? rows : cols;
      if (choice & 2) extent /= 8;
      if (choice & 4) extent /= 128;
      extent += static_cast<int64_t>((choice >> 3) % 4) - 1;
      t.shape.push_back(std::max<int64_t>(extent, 0));
    }
    size_t elements = 1;
    for (int64_t extent : t.shape)
      elements *= static_cast<size_t>(extent);
    t.bytes.resize(elements * sy::DTypeSize(t.dtype));
    for (uint8_t& byte : t.bytes)
      byte = in.Byte();
    tensors.push_back(std::move(t));
    sources.push_back("fuzz: " + name);
  }
  const sy::Checkpoint checkpoint =
      sy::Checkpoint::FromMemory("fuzz", std::move(tensors), std::move(sources));
  auto matrix = sy::LoadInt4Matrix(checkpoint, config, module, rows, cols);
  if (!matrix.ok()) {
    if (matrix.status().message().empty()) std::abort();
    return 0;
  }
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r)
    matrix.value().DecodeRow(r, row.data());
  (void)sy::PackGgml(matrix.value());
  return 0;
}
