#include "model/hf_int4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <regex>
#include <vector>

#include "base/mapped_file.h"
#include "base/thread_pool.h"
#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"

namespace sy {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// AutoAWQ packs output column 8c + kAwqOrder[k] into nibble k of a word; the inverse, which
// nibble holds column 8c + j, is kAwqNibble[j].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// A checkpoint tensor read as the int4 loader needs it: checked, then indexed.
class Tensor {
 public:
  Tensor(const CheckpointTensor& tensor) : t_(tensor) {}

  const std::string& name() const { return t_.entry->name; }
  const std::vector<int64_t>& shape() const { return t_.entry->shape; }

  template <typename... Args>
  Status Error(fmt::format_string<Args...> format, Args&&... args) const {
    return Status::Errorf("{}: tensor '{}' {}", *t_.file, name(),
                          fmt::format(format, std::forward<Args>(args)...));
  }
  Status Expect(std::initializer_list<DType> dtypes, const std::vector<int64_t>& shape) const {
    bool known = false;
    std::string names;
    for (DType dtype : dtypes) {
      known = known || t_.entry->dtype == dtype;
      names += (names.empty() ? "" : " or ") + std::string(DTypeName(dtype));
    }
    if (!known) return Error("has dtype {}; expected {}", DTypeName(t_.entry->dtype), names);
    if (t_.entry->shape != shape)
      return Error("has shape {}; expected {}", ShapeText(t_.entry->shape), ShapeText(shape));
    return Status::Ok();
  }
  // Element `index` (row-major) of an integer tensor (I32 or I64).
  int64_t Int(int64_t index) const {
    if (t_.entry->dtype == DType::kI64) {
      int64_t value;
      std::memcpy(&value, t_.data + index * 8, 8);
      return value;
    }
    int32_t value;
    std::memcpy(&value, t_.data + index * 4, 4);
    return value;
  }
  uint32_t Word(int64_t row, int64_t col) const { return Words()(row, col); }
  // The words of a 2-D I32 tensor, as values a loop can keep in registers (the unpacking loops
  // below store bytes, which may alias anything, so reading through the Tensor reloaded its
  // pointer and shape for every word: most of an int4 load).
  struct WordView {
    const uint8_t* data;
    int64_t row_words;
    uint32_t operator()(int64_t row, int64_t col) const {
      uint32_t value;
      std::memcpy(&value, data + (row * row_words + col) * 4, 4);
      return value;
    }
  };
  WordView Words() const { return {t_.data, shape()[1]}; }
  // A scale as IEEE half bits; an f32 or bf16 scale must be one a half holds exactly (bf16's 8
  // significant bits fit a half's 11 wherever the exponent is in a half's range).
  Result<uint16_t> HalfScale(int64_t row, int64_t col) const {
    const int64_t index = row * shape()[1] + col;
    uint16_t bits;
    if (t_.entry->dtype == DType::kF16) {
      std::memcpy(&bits, t_.data + index * 2, 2);
      return bits;
    }
    float value;
    if (t_.entry->dtype == DType::kBF16) {
      std::memcpy(&bits, t_.data + index * 2, 2);
      value = BF16ToF32(bits);
    } else {
      std::memcpy(&value, t_.data + index * 4, 4);
    }
    const uint16_t half = F32ToF16(value);
    const float back = GgmlHalfToF32(half);
    if (back == value || (std::isnan(back) && std::isnan(value))) return half;
    return Error(
        "[{}, {}] = {} is not exactly a half-precision value; int4 panels keep scales as "
        "halves",
        row, col, value);
  }

 private:
  const CheckpointTensor& t_;
};

// llama.cpp's Q4_0 block: a half scale, then 32 codes in 16 bytes.
constexpr int64_t kQ4_0GroupCols = 32;
constexpr int64_t kQ4_0BlockBytes = 2 + kQ4_0GroupCols / 2;

struct Unpacked {
  std::vector<uint8_t> codes;    // [rows][cols], 0..15
  std::vector<uint8_t> zeros;    // [rows][groups], 0..16
  std::vector<uint16_t> scales;  // [rows][groups], half bits
};

Result<Tensor> Need(const Checkpoint& checkpoint, const std::string& name,
                    std::set<std::string>* used, const std::string& module) {
  const CheckpointTensor* tensor = checkpoint.Find(name);
  if (tensor == nullptr)
    return Status::Errorf(
        "{}: tensor '{}' is missing (quantization_config quantizes '{}'; a module stored "
        "unquantized must be in its modules_to_not_convert or ignore list)",
        checkpoint.directory(), name, module);
  if (used) used->insert(name);
  return Tensor(*tensor);
}

const CheckpointTensor* Maybe(const Checkpoint& checkpoint, const std::string& name,
                              std::set<std::string>* used) {
  const CheckpointTensor* tensor = checkpoint.Find(name);
  if (tensor && used) used->insert(name);
  return tensor;
}

// A g_idx (GPTQ's, or compressed-tensors' weight_g_idx): only the plain order, i / group_size.
Status CheckGroupIndex(const Tensor& g_idx, int64_t cols, int64_t group_size) {
  SY_RETURN_IF_ERROR(g_idx.Expect({DType::kI32, DType::kI64}, {cols}));
  for (int64_t i = 0; i < cols; ++i)
    if (g_idx.Int(i) != i / group_size)
      return g_idx.Error(
          "[{}] = {}, not {}: act-order (desc_act) with permuted groups is not supported", i,
          g_idx.Int(i), i / group_size);
  return Status::Ok();
}

Status ReadScales(const Tensor& scales, bool transposed, int64_t rows, int64_t groups,
                  Unpacked& out) {
  out.scales.resize(static_cast<size_t>(rows * groups));
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t g = 0; g < groups; ++g) {
      SY_ASSIGN_OR_RETURN(out.scales[o * groups + g],
                          transposed ? scales.HalfScale(g, o) : scales.HalfScale(o, g));
    }
  return Status::Ok();
}

// Runs body(begin, end) over [0, count) in tiles of 64, the rows or columns a thread transposes
// together when unpacking (see UnpackAwq), on every thread however few the tiles.
void ParallelTiles(int64_t count, const std::function<void(int64_t, int64_t)>& body) {
  constexpr int64_t kTile = 64;
  ThreadPool::Global().ParallelFor(static_cast<size_t>((count + kTile - 1) / kTile),
                                   [&](size_t begin, size_t end) {
                                     for (size_t t = begin; t < end; ++t) {
                                       const int64_t first = static_cast<int64_t>(t) * kTile;
                                       body(first, std::min(count, first + kTile));
                                     }
                                   });
}

Status UnpackAwq(const Checkpoint& checkpoint, const std::string& m, int64_t rows, int64_t cols,
                 int64_t groups, std::set<std::string>* used, Unpacked& out) {
  SY_ASSIGN_OR_RETURN(Tensor qweight, Need(checkpoint, m + ".qweight", used, m));
  SY_ASSIGN_OR_RETURN(Tensor qzeros, Need(checkpoint, m + ".qzeros", used, m));
  SY_ASSIGN_OR_RETURN(Tensor scales, Need(checkpoint, m + ".scales", used, m));
  SY_RETURN_IF_ERROR(qweight.Expect({DType::kI32}, {cols, rows / 8}));
  SY_RETURN_IF_ERROR(qzeros.Expect({DType::kI32}, {groups, rows / 8}));
  SY_RETURN_IF_ERROR(scales.Expect({DType::kF16, DType::kBF16, DType::kF32}, {groups, rows}));
  // qweight is [cols][rows / 8]: the codes are transposed through an L1 tile of 64 output rows
  // (8 words) × 64 input columns, then written out 64 bytes a row. Storing each code straight to
  // its place wrote 8 rows a power of two apart, which share cache sets: twice the time.
  const Tensor::WordView words = qweight.Words();
  uint8_t* codes = out.codes.data();
  ParallelTiles(cols, [&](int64_t i0, int64_t i1) {
    uint8_t tile[64][64];  // 64 output rows (8 words) × the tile's input columns
    for (int64_t c0 = 0; c0 < rows / 8; c0 += 8) {
      const int64_t c1 = std::min(rows / 8, c0 + 8);
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t c = c0; c < c1; ++c) {
          const uint32_t word = words(i, c);
          for (int j = 0; j < 8; ++j)
            tile[8 * (c - c0) + j][i - i0] = (word >> (4 * kAwqNibble[j])) & 15;
        }
      for (int64_t r = 0; r < 8 * (c1 - c0); ++r)
        std::memcpy(codes + (8 * c0 + r) * cols + i0, tile[r], static_cast<size_t>(i1 - i0));
    }
  });
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < rows / 8; ++c) {
      const uint32_t word = qzeros.Word(g, c);
      for (int j = 0; j < 8; ++j)
        out.zeros[(8 * c + j) * groups + g] = (word >> (4 * kAwqNibble[j])) & 15;
    }
  return ReadScales(scales, true, rows, groups, out);
}

Status UnpackGptq(const Checkpoint& checkpoint, const Int4Config& config, const std::string& m,
                  int64_t rows, int64_t cols, int64_t groups, std::set<std::string>* used,
                  Unpacked& out) {
  SY_ASSIGN_OR_RETURN(Tensor qweight, Need(checkpoint, m + ".qweight", used, m));
  SY_ASSIGN_OR_RETURN(Tensor qzeros, Need(checkpoint, m + ".qzeros", used, m));
  SY_ASSIGN_OR_RETURN(Tensor scales, Need(checkpoint, m + ".scales", used, m));
  SY_RETURN_IF_ERROR(qweight.Expect({DType::kI32}, {cols / 8, rows}));
  SY_RETURN_IF_ERROR(qzeros.Expect({DType::kI32}, {groups, rows / 8}));
  SY_RETURN_IF_ERROR(scales.Expect({DType::kF16, DType::kBF16, DType::kF32}, {groups, rows}));
  if (const CheckpointTensor* g_idx = Maybe(checkpoint, m + ".g_idx", used))
    SY_RETURN_IF_ERROR(CheckGroupIndex(Tensor(*g_idx), cols, config.group_size));
  // qweight is [cols / 8][rows]: through an L1 tile of 64 output rows × 64 input columns, as in
  // UnpackAwq.
  const Tensor::WordView words = qweight.Words();
  uint8_t* codes = out.codes.data();
  ParallelTiles(rows, [&](int64_t o0, int64_t o1) {
    uint8_t tile[64][64];  // the tile's output rows × 64 input columns (8 words)
    for (int64_t r0 = 0; r0 < cols / 8; r0 += 8) {
      const int64_t r1 = std::min(cols / 8, r0 + 8);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t o = o0; o < o1; ++o) {
          const uint32_t word = words(r, o);
          for (int k = 0; k < 8; ++k)
            tile[o - o0][8 * (r - r0) + k] = (word >> (4 * k)) & 15;
        }
      for (int64_t o = o0; o < o1; ++o)
        std::memcpy(codes + o * cols + 8 * r0, tile[o - o0], static_cast<size_t>(8 * (r1 - r0)));
    }
  });
  const int plus = config.gptq_zeros_minus_one ? 1 : 0;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < rows / 8; ++c) {
      const uint32_t word = qzeros.Word(g, c);
      for (int k = 0; k < 8; ++k)
        out.zeros[(8 * c + k) * groups + g] = static_cast<uint8_t>(((word >> (4 * k)) & 15) + plus);
    }
  return ReadScales(scales, true, rows, groups, out);
}

Status UnpackCompressed(const Checkpoint& checkpoint, const Int4Config& config,
                        const std::string& m, int64_t rows, int64_t cols, int64_t groups,
                        std::set<std::string>* used, Unpacked& out) {
  SY_ASSIGN_OR_RETURN(Tensor packed, Need(checkpoint, m + ".weight_packed", used, m));
  SY_ASSIGN_OR_RETURN(Tensor scales, Need(checkpoint, m + ".weight_scale", used, m));
  SY_ASSIGN_OR_RETURN(Tensor shape, Need(checkpoint, m + ".weight_shape", used, m));
  SY_RETURN_IF_ERROR(shape.Expect({DType::kI32, DType::kI64}, {2}));
  if (shape.Int(0) != rows || shape.Int(1) != cols)
    return shape.Error("is [{}, {}] but config.json implies [{}, {}]", shape.Int(0), shape.Int(1),
                       rows, cols);
  SY_RETURN_IF_ERROR(packed.Expect({DType::kI32}, {rows, cols / 8}));
  SY_RETURN_IF_ERROR(scales.Expect({DType::kF16, DType::kBF16, DType::kF32}, {rows, groups}));
  if (const CheckpointTensor* g_idx = Maybe(checkpoint, m + ".weight_g_idx", used))
    SY_RETURN_IF_ERROR(CheckGroupIndex(Tensor(*g_idx), cols, config.group_size));
  const Tensor::WordView words = packed.Words();
  uint8_t* codes = out.codes.data();
  ParallelRows(rows, [&](int64_t o) {
    for (int64_t c = 0; c < cols / 8; ++c) {
      const uint32_t word = words(o, c);
      for (int k = 0; k < 8; ++k)
        codes[o * cols + 8 * c + k] = (word >> (4 * k)) & 15;
    }
  });
  if (config.symmetric) {
    std::fill(out.zeros.begin(), out.zeros.end(), 8);
  } else {
    SY_ASSIGN_OR_RETURN(Tensor zero_point, Need(checkpoint, m + ".weight_zero_point", used, m));
    SY_RETURN_IF_ERROR(zero_point.Expect({DType::kI32}, {(rows + 7) / 8, groups}));
    for (int64_t r = 0; r < (rows + 7) / 8; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const uint32_t word = zero_point.Word(r, g);
        for (int k = 0; k < 8 && 8 * r + k < rows; ++k)
          out.zeros[(8 * r + k) * groups + g] = (word >> (4 * k)) & 15;
      }
  }
  return ReadScales(scales, false, rows, groups, out);
}

}  // namespace

bool Int4Quantizes(const Int4Config& config, const std::string& module) {
  // A wrapper's checkpoint (Kimi K2.5's "language_model.") may name its modules either way.
  const std::string full = config.module_prefix + module;
  for (const std::string& entry : config.not_converted) {
    if (!config.ignore_is_regex_list) {
      if (full.find(entry) != std::string::npos) return false;
    } else if (entry.rfind("re:", 0) == 0) {
      // compressed-tensors: Python's re.match, anchored at the start only.
      try {
        const std::regex pattern(entry.substr(3));
        for (const std::string* name : {&module, &full})
          if (std::regex_search(*name, pattern, std::regex_constants::match_continuous))
            return false;
      } catch (const std::regex_error&) {
        // A pattern std::regex cannot read matches nothing; the module is then expected
        // quantized, and a missing tensor says so.
      }
    } else if (module == entry || full == entry) {
      return false;
    }
  }
  return true;
}

std::vector<std::string> Int4TensorNames(const Int4Config& config, const std::string& module) {
  switch (config.format) {
    case Int4Format::kAwq:
      return {module + ".qweight", module + ".qzeros", module + ".scales"};
    case Int4Format::kGptq:
      return {module + ".qweight", module + ".qzeros", module + ".scales", module + ".g_idx"};
    case Int4Format::kCompressed:
      return {module + ".weight_packed", module + ".weight_scale", module + ".weight_shape",
              module + ".weight_zero_point", module + ".weight_g_idx"};
    default:
      return {};
  }
}

Result<Matrix> LoadInt4Matrix(const Checkpoint& checkpoint, const Int4Config& config,
                              const std::string& module, int64_t rows, int64_t cols,
                              std::set<std::string>* used) {
  const int64_t g = config.group_size;
  const bool q4_0 = g == kQ4_0GroupCols;
  if (g != kHfInt4GroupCols && !(q4_0 && config.format == Int4Format::kCompressed))
    return Status::Errorf(
        "{}: group size {} for '{}'; supported: {}, and {} for compressed-tensors",
        checkpoint.directory(), g, module, kHfInt4GroupCols, kQ4_0GroupCols);
  if (rows <= 0 || cols <= 0 || cols % g != 0 || rows % 8 != 0)
    return Status::Errorf(
        "{}: '{}' is [{}, {}]: int4 layers need input columns in whole groups of {} and output "
        "rows in whole words of 8",
        checkpoint.directory(), module, rows, cols, g);
  const int64_t groups = cols / g;
  Unpacked unpacked;
  unpacked.codes.resize(static_cast<size_t>(rows * cols));
  unpacked.zeros.resize(static_cast<size_t>(rows * groups));
  switch (config.format) {
    case Int4Format::kAwq:
      SY_RETURN_IF_ERROR(UnpackAwq(checkpoint, module, rows, cols, groups, used, unpacked));
      break;
    case Int4Format::kGptq:
      SY_RETURN_IF_ERROR(
          UnpackGptq(checkpoint, config, module, rows, cols, groups, used, unpacked));
      break;
    case Int4Format::kCompressed:
      SY_RETURN_IF_ERROR(
          UnpackCompressed(checkpoint, config, module, rows, cols, groups, used, unpacked));
      break;
    default:
      return Status::Errorf("'{}': the checkpoint has no int4 quantization_config", module);
  }
  std::shared_ptr<std::vector<uint8_t>> blocks;
  if (q4_0) {
    // Groups of 32, symmetric: (q − 8) · s is llama.cpp's Q4_0 exactly (a half scale, the codes
    // of elements j and j + 16 sharing byte j), which the GGML kernels multiply natively.
    for (size_t i = 0; i < unpacked.zeros.size(); ++i)
      if (unpacked.zeros[i] != 8)
        return Status::Errorf(
            "{}: '{}' has a zero point other than 8 in groups of {}; supported there: symmetric "
            "schemes",
            checkpoint.directory(), module, g);
    blocks = std::make_shared<std::vector<uint8_t>>(
        static_cast<size_t>(rows * groups * kQ4_0BlockBytes));
    ParallelRows(rows, [&](int64_t o) {
      for (int64_t b = 0; b < groups; ++b) {
        uint8_t* block = blocks->data() + (o * groups + b) * kQ4_0BlockBytes;
        std::memcpy(block, &unpacked.scales[o * groups + b], 2);
        const uint8_t* q = unpacked.codes.data() + o * cols + b * g;
        for (int64_t j = 0; j < g / 2; ++j)
          block[2 + j] = static_cast<uint8_t>(q[j] | q[j + g / 2] << 4);
      }
    });
  } else {
    // HF_INT4_G128 blocks (tensor/ggml_quants.h), row after row.
    blocks = std::make_shared<std::vector<uint8_t>>(
        static_cast<size_t>(rows * groups * kHfInt4BlockBytes));
    ParallelRows(rows, [&](int64_t o) {
      for (int64_t b = 0; b < groups; ++b) {
        uint8_t* block = blocks->data() + (o * groups + b) * kHfInt4BlockBytes;
        std::memcpy(block, &unpacked.scales[o * groups + b], 2);
        block[2] = unpacked.zeros[o * groups + b];
        const uint8_t* q = unpacked.codes.data() + o * cols + b * g;
        for (int64_t i = 0; i < g / 2; ++i)
          block[4 + i] = static_cast<uint8_t>(q[2 * i] | q[2 * i + 1] << 4);
      }
    });
  }
  // The checkpoint's packed tensors are read once: give their mapped pages back, so resident
  // memory holds the weights once (as PackMatrix does for other formats' matrices).
  if (used)
    for (const std::string& name : Int4TensorNames(config, module))
      if (const CheckpointTensor* t = checkpoint.Find(name))
        MappedFile::ReleaseRange(t->data,
                                 static_cast<size_t>(t->entry->data_end - t->entry->data_begin));
  Matrix m;
  m.dtype = DType::kGgml;
  m.ggml_type = q4_0 ? GgmlType::kQ4_0 : GgmlType::kHfInt4;
  m.rows = rows;
  m.cols = cols;
  m.data = blocks->data();
  m.owner = blocks;
  m.rows_dropped_when_packed = true;
  return m;
}

}  // namespace sy
