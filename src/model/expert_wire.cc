#include "model/expert_wire.h"

#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "tensor/packed_matrix.h"

namespace sy {

namespace {

constexpr uint32_t kMagic = 0x58455953;  // "SYEX"
constexpr uint8_t kRows = 0, kPanels = 1;

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  template <typename T>
  void Put(T value) {
    Bytes(&value, sizeof value);
  }
  void Bytes(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + size);
  }
  template <typename T, typename Allocator>
  void Vector(const std::vector<T, Allocator>& values) {
    Put<uint64_t>(values.size());
    Bytes(values.data(), values.size() * sizeof(T));
  }

 private:
  std::vector<uint8_t>& out_;
};

class Reader {
 public:
  Reader(const std::vector<uint8_t>& in, std::string where) : in_(in), where_(std::move(where)) {}
  template <typename T>
  Result<T> Get() {
    T value;
    SY_RETURN_IF_ERROR(Bytes(&value, sizeof value));
    return value;
  }
  Status Bytes(void* out, size_t size) {
    if (size == 0) return Status::Ok();  // an empty vector's data() may be null
    if (size > in_.size() - offset_)
      return Status::Errorf("{}: the message ends at byte {} where {} more were due", where_,
                            in_.size(), size);
    std::memcpy(out, in_.data() + offset_, size);
    offset_ += size;
    return Status::Ok();
  }
  template <typename T, typename Allocator = std::allocator<T>>
  Result<std::vector<T, Allocator>> Vector(size_t expected, std::string_view what) {
    SY_ASSIGN_OR_RETURN(const uint64_t count, Get<uint64_t>());
    if (count != expected)
      return Status::Errorf("{}: {} has {} values where {} were due", where_, what, count,
                            expected);
    std::vector<T, Allocator> values(count);
    SY_RETURN_IF_ERROR(Bytes(values.data(), count * sizeof(T)));
    return values;
  }
  template <typename T>
  Result<PanelVector<T>> PanelScales(size_t expected, std::string_view what) {
    return Vector<T, PanelAllocator<T>>(expected, what);
  }
  bool AtEnd() const { return offset_ == in_.size(); }
  const std::string& where() const { return where_; }
  void set_where(std::string where) { where_ = std::move(where); }

 private:
  const std::vector<uint8_t>& in_;
  size_t offset_ = 0;
  std::string where_;
};

bool Travels(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 ||
         dtype == DType::kF8E4M3;
}

// a ≥ 0; b comes off the wire and may be huge, so a + b - 1 could overflow.
int64_t CeilDiv(int64_t a, int64_t b) {
  return b > 0 ? a / b + (a % b != 0 ? 1 : 0) : 0;
}

size_t RowScaleCount(const Matrix& m) {
  return m.dtype == DType::kF8E4M3
             ? static_cast<size_t>(CeilDiv(m.first_row + m.rows, m.block_rows) * m.scale_cols)
             : 0;
}

void WriteMatrix(const Matrix& m, Writer& w) {
  w.Put<uint8_t>(static_cast<uint8_t>(m.dtype));
  for (int64_t v : {m.rows, m.cols, m.block_rows, m.block_cols, m.scale_cols})
    w.Put<int64_t>(v);
  if (m.dtype == DType::kGgml) w.Put<uint32_t>(static_cast<uint32_t>(m.ggml_type));
  const PackedMatrix* p = m.packed.get();
  if (p != nullptr) {
    w.Put<uint8_t>(kPanels);
    w.Put<uint8_t>(static_cast<uint8_t>(p->dtype));
    w.Put<uint8_t>(p->bf16_pairs ? 1 : 0);
    for (int64_t v :
         {p->rows, p->cols, p->panels, p->block_rows, p->block_cols, p->scale_cols, p->groups})
      w.Put<int64_t>(v);
    w.Put<uint64_t>(p->Bytes());
    w.Bytes(p->data.get(), p->Bytes());
    w.Vector(p->scales);
    w.Vector(p->row_scales);
    w.Vector(p->row_offsets);
    if (p->dtype == DType::kGgml) {  // the layout itself follows from the block type
      w.Vector(p->sub_scales);
      w.Vector(p->sub_mins);
      w.Vector(p->super_d);
      w.Vector(p->super_dmin);
    }
  } else {
    // Rows [first_row, first_row + rows) of the stored matrix: its scale rows from the first.
    w.Put<uint8_t>(kRows);
    const size_t bytes = static_cast<size_t>(m.rows) * m.RowBytes();
    w.Put<uint64_t>(bytes);
    w.Bytes(m.data, bytes);
    const int64_t first_block = m.block_rows > 0 ? m.first_row / m.block_rows : 0;
    const size_t skipped = static_cast<size_t>(first_block * m.scale_cols);
    std::vector<float> scales;
    if (m.dtype == DType::kF8E4M3)
      scales.assign(m.block_scales + skipped, m.block_scales + RowScaleCount(m));
    w.Put<int64_t>(m.first_row - first_block * m.block_rows);
    w.Vector(scales);
  }
}

// Owned storage of a matrix that arrived as rows.
struct ArrivedRows {
  std::vector<uint8_t> data;
  std::vector<float> scales;
};

Result<Matrix> ReadMatrix(Reader& r, int64_t rows, int64_t cols) {
  Matrix m;
  SY_ASSIGN_OR_RETURN(const uint8_t dtype, r.Get<uint8_t>());
  m.dtype = static_cast<DType>(dtype);
  const bool ggml = m.dtype == DType::kGgml;  // a GGUF's or an int4 checkpoint's blocks
  if (dtype > static_cast<uint8_t>(DType::kGgml) || !(Travels(m.dtype) || ggml))
    return Status::Errorf("{}: element type {} cannot be an expert's", r.where(), dtype);
  for (int64_t* v : {&m.rows, &m.cols, &m.block_rows, &m.block_cols, &m.scale_cols}) {
    SY_ASSIGN_OR_RETURN(*v, r.Get<int64_t>());
  }
  if (m.rows != rows || m.cols != cols)
    return Status::Errorf("{}: {}×{} where the model's experts are {}×{}", r.where(), m.rows,
                          m.cols, rows, cols);
  if (ggml) {
    SY_ASSIGN_OR_RETURN(const uint32_t type, r.Get<uint32_t>());
    const auto traits = GgmlTypeInfo(type);
    if (!traits || traits->block_size <= 0 || cols % traits->block_size != 0)
      return Status::Errorf("{}: GGML block type {} does not fit {} columns", r.where(), type,
                            cols);
    m.ggml_type = traits->type;
  }
  const bool fp8 = m.dtype == DType::kF8E4M3;
  if (fp8 &&
      (m.block_rows <= 0 || m.block_cols <= 0 || m.scale_cols != CeilDiv(cols, m.block_cols)))
    return Status::Errorf("{}: fp8 blocks {}×{} with {} scale columns do not fit {} columns",
                          r.where(), m.block_rows, m.block_cols, m.scale_cols, cols);
  SY_ASSIGN_OR_RETURN(const uint8_t form, r.Get<uint8_t>());
  if (form == kPanels) {
    auto p = std::make_shared<PackedMatrix>();
    SY_ASSIGN_OR_RETURN(const uint8_t packed_dtype, r.Get<uint8_t>());
    p->dtype = static_cast<DType>(packed_dtype);
    const bool ggml_panels = p->dtype == DType::kGgml;
    if (packed_dtype > static_cast<uint8_t>(DType::kGgml) ||
        !(Travels(p->dtype) || p->dtype == DType::kI8 || (ggml_panels && ggml)))
      return Status::Errorf("{}: panels of element type {}", r.where(), packed_dtype);
    SY_ASSIGN_OR_RETURN(const uint8_t pairs, r.Get<uint8_t>());
    if (pairs > 1 || (pairs == 1 && p->dtype != DType::kBF16))
      return Status::Errorf("{}: panel layout {} for element type {}", r.where(), pairs,
                            packed_dtype);
    p->bf16_pairs = pairs == 1;
    if (ggml_panels && !SetGgmlPanelLayout(m.ggml_type, *p))
      return Status::Errorf("{}: GGML block type {} has no panel form", r.where(),
                            static_cast<uint32_t>(m.ggml_type));
    for (int64_t* v : {&p->rows, &p->cols, &p->panels, &p->block_rows, &p->block_cols,
                       &p->scale_cols, &p->groups}) {
      SY_ASSIGN_OR_RETURN(*v, r.Get<int64_t>());
    }
    if (p->rows != rows || p->cols != cols || p->panels != CeilDiv(rows, kPanelRows))
      return Status::Errorf("{}: panels of {}×{} in {} panels where {}×{} was due", r.where(),
                            p->rows, p->cols, p->panels, rows, cols);
    if (p->bf16_pairs && cols % 32 != 0)
      return Status::Errorf("{}: bf16 pairs of {} columns (not whole tiles of 32)", r.where(),
                            cols);
    SY_ASSIGN_OR_RETURN(const uint64_t bytes, r.Get<uint64_t>());
    if (bytes != p->Bytes())
      return Status::Errorf("{}: {} bytes of panels where {} were due", r.where(), bytes,
                            p->Bytes());
    p->data = AllocatePanels(bytes);
    SY_RETURN_IF_ERROR(r.Bytes(p->data.get(), bytes));
    const bool packed_fp8 = p->dtype == DType::kF8E4M3;
    if (packed_fp8 && (p->block_rows <= 0 || p->block_rows % kPanelRows != 0 ||
                       p->block_cols <= 0 || p->scale_cols != CeilDiv(cols, p->block_cols)))
      return Status::Errorf("{}: fp8 panel blocks {}×{} do not fit", r.where(), p->block_rows,
                            p->block_cols);
    const size_t scales =
        packed_fp8 ? static_cast<size_t>(CeilDiv(rows, p->block_rows) * p->scale_cols) : 0;
    const bool int8 = p->dtype == DType::kI8;
    if (int8 && p->groups != CeilDiv(cols, kInt8GroupCols))
      return Status::Errorf("{}: {} int8 groups for {} columns", r.where(), p->groups, cols);
    const size_t per_row = int8 ? static_cast<size_t>(p->panels * p->groups * kPanelRows) : 0;
    SY_ASSIGN_OR_RETURN(p->scales, r.Vector<float>(scales, "the panels' block scales"));
    SY_ASSIGN_OR_RETURN(p->row_scales, r.PanelScales<float>(per_row, "the int8 row scales"));
    SY_ASSIGN_OR_RETURN(p->row_offsets, r.PanelScales<int32_t>(per_row, "the int8 row offsets"));
    if (ggml_panels) {
      const size_t subs = static_cast<size_t>(p->panels * (cols / p->sub_cols) * kPanelRows);
      const size_t supers = static_cast<size_t>(p->panels * (cols / p->super_cols) * kPanelRows);
      SY_ASSIGN_OR_RETURN(p->sub_scales,
                          r.PanelScales<int8_t>(p->unit_scales ? 0 : subs, "the sub-block scales"));
      SY_ASSIGN_OR_RETURN(
          p->sub_mins,
          r.PanelScales<int8_t>(p->unit_scales || p->shared_d ? 0 : subs, "the sub-block mins"));
      SY_ASSIGN_OR_RETURN(p->super_d, r.PanelScales<uint16_t>(supers, "the block scales d"));
      SY_ASSIGN_OR_RETURN(p->super_dmin, r.PanelScales<uint16_t>(p->shared_d ? 0 : supers,
                                                                 "the block scales dmin"));
    }
    // In this process's layout: the sender may pack bf16 the other way (`--amx-bf16` on one
    // machine with AMX and one without).
    SetBf16Pairs(*p, Bf16PairsWanted(p->dtype, p->cols));
    // The panels carry everything a product reads; no rows travel with them (the kernels read
    // an expert's panels only).
    m.packed = std::move(p);
    return m;
  }
  if (form != kRows) return Status::Errorf("{}: unknown form {}", r.where(), form);
  SY_ASSIGN_OR_RETURN(const uint64_t bytes, r.Get<uint64_t>());
  if (bytes != static_cast<uint64_t>(rows) * m.RowBytes())
    return Status::Errorf("{}: {} bytes of rows where {} were due", r.where(), bytes,
                          static_cast<uint64_t>(rows) * m.RowBytes());
  auto storage = std::make_shared<ArrivedRows>();
  storage->data.resize(bytes);
  SY_RETURN_IF_ERROR(r.Bytes(storage->data.data(), bytes));
  SY_ASSIGN_OR_RETURN(m.first_row, r.Get<int64_t>());
  if (m.first_row < 0 || (fp8 && m.first_row >= m.block_rows) || (!fp8 && m.first_row != 0))
    return Status::Errorf("{}: first row {} inside its scale block", r.where(), m.first_row);
  SY_ASSIGN_OR_RETURN(storage->scales, r.Vector<float>(RowScaleCount(m), "the block scales"));
  m.data = storage->data.data();
  m.block_scales = fp8 ? storage->scales.data() : nullptr;
  m.owner = std::move(storage);
  return m;
}

// Bitwise, so that NaN scales compare equal to themselves.
template <typename T, typename Allocator>
bool SameBytes(const std::vector<T, Allocator>& a, const std::vector<T, Allocator>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

Status SameMatrixBytes(const Matrix& a, const Matrix& b, std::string_view name) {
  if (a.dtype != b.dtype || a.rows != b.rows || a.cols != b.cols ||
      (a.dtype == DType::kGgml && a.ggml_type != b.ggml_type))
    return Status::Errorf("{}: shape or element type differs", name);
  const PackedMatrix* p = a.packed.get();
  const PackedMatrix* q = b.packed.get();
  if ((p == nullptr) != (q == nullptr)) return Status::Errorf("{}: one is packed", name);
  if (p != nullptr) {
    if (p->dtype != q->dtype || p->panels != q->panels || p->Bytes() != q->Bytes() ||
        p->block_rows != q->block_rows || p->block_cols != q->block_cols ||
        p->groups != q->groups || p->bf16_pairs != q->bf16_pairs)
      return Status::Errorf("{}: the panels' layout differs", name);
    if (p->Bytes() > 0 && std::memcmp(p->data.get(), q->data.get(), p->Bytes()) != 0)
      return Status::Errorf("{}: the panels differ", name);
    if (!SameBytes(p->scales, q->scales) || !SameBytes(p->row_scales, q->row_scales) ||
        !SameBytes(p->row_offsets, q->row_offsets) || p->ggml_type != q->ggml_type ||
        !SameBytes(p->sub_scales, q->sub_scales) || !SameBytes(p->sub_mins, q->sub_mins) ||
        !SameBytes(p->super_d, q->super_d) || !SameBytes(p->super_dmin, q->super_dmin))
      return Status::Errorf("{}: the panels' scales differ", name);
    return Status::Ok();
  }
  const size_t bytes = static_cast<size_t>(a.rows) * a.RowBytes();
  if (bytes > 0 && std::memcmp(a.data, b.data, bytes) != 0)
    return Status::Errorf("{}: the rows differ", name);
  for (int64_t row = 0; a.dtype == DType::kF8E4M3 && row < a.rows; row += a.block_rows) {
    const float* sa = a.block_scales + ((a.first_row + row) / a.block_rows) * a.scale_cols;
    const float* sb = b.block_scales + ((b.first_row + row) / b.block_rows) * b.scale_cols;
    if (std::memcmp(sa, sb, static_cast<size_t>(a.scale_cols) * 4) != 0)
      return Status::Errorf("{}: the block scales differ", name);
  }
  return Status::Ok();
}

}  // namespace

std::vector<uint8_t> SerializeExpert(const FeedForwardWeights& expert) {
  std::vector<uint8_t> out;
  Writer w(out);
  w.Put<uint32_t>(kMagic);
  for (const Matrix* m : {&expert.gate_proj, &expert.up_proj, &expert.down_proj})
    WriteMatrix(*m, w);
  return out;
}

Result<FeedForwardWeights> DeserializeExpert(const std::vector<uint8_t>& bytes, int64_t width,
                                             int64_t hidden) {
  Reader r(bytes, "an arriving expert");
  SY_ASSIGN_OR_RETURN(const uint32_t magic, r.Get<uint32_t>());
  if (magic != kMagic) return Status::Errorf("an arriving expert: not an expert's message");
  FeedForwardWeights out;
  r.set_where("an arriving expert's gate_proj");
  SY_ASSIGN_OR_RETURN(out.gate_proj, ReadMatrix(r, width, hidden));
  r.set_where("an arriving expert's up_proj");
  SY_ASSIGN_OR_RETURN(out.up_proj, ReadMatrix(r, width, hidden));
  r.set_where("an arriving expert's down_proj");
  SY_ASSIGN_OR_RETURN(out.down_proj, ReadMatrix(r, hidden, width));
  if (!r.AtEnd()) return Status::Errorf("an arriving expert: bytes left after down_proj");
  return out;
}

Status SameExpertBytes(const FeedForwardWeights& a, const FeedForwardWeights& b) {
  SY_RETURN_IF_ERROR(SameMatrixBytes(a.gate_proj, b.gate_proj, "gate_proj"));
  SY_RETURN_IF_ERROR(SameMatrixBytes(a.up_proj, b.up_proj, "up_proj"));
  return SameMatrixBytes(a.down_proj, b.down_proj, "down_proj");
}

}  // namespace sy
