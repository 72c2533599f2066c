#include "model/weights.h"

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <set>
#include <utility>

#include "base/mapped_file.h"
#include "model/expert_placement.h"
#include "model/gguf_model.h"
#include "model/hf_int4.h"
#include "tensor/packed_matrix.h"

namespace sy {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Reads named tensors out of a checkpoint, checking each against what config.json implies.
class TensorReader {
 public:
  TensorReader(const Checkpoint& checkpoint, const ModelConfig& config)
      : checkpoint_(checkpoint), config_(config) {}

  const std::set<std::string>& used() const { return used_; }

  const CheckpointTensor* Find(const std::string& name) const { return checkpoint_.Find(name); }

  Result<const CheckpointTensor*> Require(const std::string& name) {
    const CheckpointTensor* tensor = checkpoint_.Find(name);
    if (tensor == nullptr)
      return Status::Errorf("{}: tensor '{}' is missing", checkpoint_.directory(), name);
    used_.insert(name);
    return tensor;
  }

  Status CheckShape(const CheckpointTensor& tensor, const std::vector<int64_t>& expected) {
    if (tensor.entry->shape == expected) return Status::Ok();
    return Status::Errorf("{}: tensor '{}' has shape {} but config.json implies {}", *tensor.file,
                          tensor.entry->name, ShapeString(tensor.entry->shape),
                          ShapeString(expected));
  }

  // A [rows, cols] weight: f32/bf16/f16, or fp8-e4m3 with its `_scale_inv` block scales.
  Result<Matrix> LoadMatrix(const std::string& name, int64_t rows, int64_t cols,
                            bool may_be_fp8 = true) {
    // An int4 checkpoint's linear layers (model/hf_int4.h): embeddings, lm_head and the router
    // (may_be_fp8 false) stay dense, as do the modules its config leaves out.
    const std::string module = name.substr(0, name.size() - std::string_view(".weight").size());
    if (config_.int4.enabled() && may_be_fp8 && name.ends_with(".weight") &&
        Int4Quantizes(config_.int4, module)) {
      SY_ASSIGN_OR_RETURN(Matrix m,
                          LoadInt4Matrix(checkpoint_, config_.int4, module, rows, cols, &used_));
      if (GlobalGgufWeights() == GgufWeights::kNative) return m;
      // Dequantized at load, as GGUF's blocks are under kDequantized: f32, exact.
      std::vector<float> values(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        m.DecodeRow(r, values.data() + r * cols);
      return OwnedF32Matrix(std::move(values), rows, cols);
    }
    SY_ASSIGN_OR_RETURN(const CheckpointTensor* tensor, Require(name));
    SY_RETURN_IF_ERROR(CheckShape(*tensor, {rows, cols}));
    Matrix m;
    m.dtype = tensor->entry->dtype;
    m.rows = rows;
    m.cols = cols;
    m.data = tensor->data;
    m.ggml_type = tensor->entry->ggml_type;
    switch (m.dtype) {
      case DType::kF32:
      case DType::kBF16:
      case DType::kF16:
      case DType::kGgml:  // GGUF blocks (model/gguf_model.h), their sizes checked by the reader
        return m;
      case DType::kF8E4M3:
        break;
      default:
        return Status::Errorf(
            "{}: tensor '{}' has dtype {}; weights must be F32, BF16, F16 or "
            "F8_E4M3",
            *tensor->file, name, DTypeName(m.dtype));
    }
    if (!may_be_fp8)
      return Status::Errorf("{}: tensor '{}' is F8_E4M3 but this weight is never quantized",
                            *tensor->file, name);
    if (!config_.fp8_weights)
      return Status::Errorf(
          "{}: tensor '{}' is F8_E4M3 but config.json has no fp8 "
          "quantization_config",
          *tensor->file, name);
    const std::string scale_name = name + "_scale_inv";
    SY_ASSIGN_OR_RETURN(const CheckpointTensor* scales, Require(scale_name));
    if (scales->entry->dtype != DType::kF32)
      return Status::Errorf("{}: tensor '{}' must be F32, not {}", *scales->file, scale_name,
                            DTypeName(scales->entry->dtype));
    m.block_rows = config_.weight_block_rows;
    m.block_cols = config_.weight_block_cols;
    m.scale_cols = CeilDiv(cols, m.block_cols);
    SY_RETURN_IF_ERROR(CheckShape(*scales, {CeilDiv(rows, m.block_rows), m.scale_cols}));
    // Copy the scales: they are small, and the mapping gives no alignment guarantee for floats.
    auto copy =
        std::make_shared<std::vector<float>>(static_cast<size_t>(scales->entry->NumElements()));
    std::memcpy(copy->data(), scales->data, copy->size() * sizeof(float));
    m.block_scales = copy->data();
    m.owner = copy;
    return m;
  }

  // A 1-D f32/bf16/f16 vector of `size`, converted to f32.
  Result<std::vector<float>> LoadVector(const std::string& name, int64_t size) {
    SY_ASSIGN_OR_RETURN(const CheckpointTensor* tensor, Require(name));
    SY_RETURN_IF_ERROR(CheckShape(*tensor, {size}));
    DType dtype = tensor->entry->dtype;
    if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16 &&
        dtype != DType::kGgml)
      return Status::Errorf("{}: tensor '{}' has dtype {}; expected F32, BF16 or F16",
                            *tensor->file, name, DTypeName(dtype));
    Matrix view;
    view.dtype = dtype;
    view.ggml_type = tensor->entry->ggml_type;
    view.rows = 1;
    view.cols = size;
    view.data = tensor->data;
    std::vector<float> values(static_cast<size_t>(size));
    view.DecodeRow(0, values.data());
    return values;
  }

 private:
  const Checkpoint& checkpoint_;
  const ModelConfig& config_;
  std::set<std::string> used_;
};

Result<FeedForwardWeights> LoadFeedForward(TensorReader& reader, const std::string& prefix,
                                           int64_t width, int64_t hidden) {
  FeedForwardWeights ff;
  SY_ASSIGN_OR_RETURN(ff.gate_proj, reader.LoadMatrix(prefix + ".gate_proj.weight", width, hidden));
  SY_ASSIGN_OR_RETURN(ff.up_proj, reader.LoadMatrix(prefix + ".up_proj.weight", width, hidden));
  SY_ASSIGN_OR_RETURN(ff.down_proj, reader.LoadMatrix(prefix + ".down_proj.weight", hidden, width));
  return ff;
}

Result<DecoderLayerWeights> LoadDecoderLayer(TensorReader& reader, const ModelConfig& c,
                                             int64_t layer, const WeightLoadOptions& options) {
  const std::string p = "model.layers." + std::to_string(layer);
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  DecoderLayerWeights w;
  AttentionWeights& a = w.self_attn;
  SY_ASSIGN_OR_RETURN(a.input_layernorm, reader.LoadVector(p + ".input_layernorm.weight", D));
  const std::string attn = p + ".self_attn";
  if (c.q_lora_rank) {
    SY_ASSIGN_OR_RETURN(a.q_a_proj,
                        reader.LoadMatrix(attn + ".q_a_proj.weight", *c.q_lora_rank, D));
    SY_ASSIGN_OR_RETURN(a.q_a_layernorm,
                        reader.LoadVector(attn + ".q_a_layernorm.weight", *c.q_lora_rank));
    SY_ASSIGN_OR_RETURN(a.q_b_proj, reader.LoadMatrix(attn + ".q_b_proj.weight",
                                                      H * c.qk_head_dim(), *c.q_lora_rank));
  } else {
    SY_ASSIGN_OR_RETURN(a.q_proj,
                        reader.LoadMatrix(attn + ".q_proj.weight", H * c.qk_head_dim(), D));
  }
  SY_ASSIGN_OR_RETURN(a.kv_a_proj_with_mqa, reader.LoadMatrix(attn + ".kv_a_proj_with_mqa.weight",
                                                              c.latent_cache_width(), D));
  SY_ASSIGN_OR_RETURN(a.kv_a_layernorm,
                      reader.LoadVector(attn + ".kv_a_layernorm.weight", c.kv_lora_rank));
  SY_ASSIGN_OR_RETURN(a.kv_b_proj,
                      reader.LoadMatrix(attn + ".kv_b_proj.weight",
                                        H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank));
  if (reader.Find(attn + ".gguf_k_b.weight") && reader.Find(attn + ".gguf_v_b.weight")) {
    SY_ASSIGN_OR_RETURN(a.gguf_k_b, reader.LoadMatrix(attn + ".gguf_k_b.weight", H * c.kv_lora_rank,
                                                      c.qk_nope_head_dim));
    SY_ASSIGN_OR_RETURN(
        a.gguf_v_b, reader.LoadMatrix(attn + ".gguf_v_b.weight", H * c.v_head_dim, c.kv_lora_rank));
  }
  SY_ASSIGN_OR_RETURN(a.o_proj, reader.LoadMatrix(attn + ".o_proj.weight", D, H * c.v_head_dim));
  // Every main layer of a DSA model has its indexer; an MTP layer stored without one drafts with
  // dense attention (its drafts are verified by the main layers either way).
  const std::string indexer = attn + ".indexer";
  if (c.has_indexer() &&
      (layer < c.num_hidden_layers || reader.Find(indexer + ".wk.weight") != nullptr)) {
    const int64_t dI = c.index_head_dim;
    SY_ASSIGN_OR_RETURN(a.indexer_wq_b, reader.LoadMatrix(indexer + ".wq_b.weight",
                                                          c.index_n_heads * dI, *c.q_lora_rank));
    SY_ASSIGN_OR_RETURN(a.indexer_wk, reader.LoadMatrix(indexer + ".wk.weight", dI, D));
    SY_ASSIGN_OR_RETURN(a.indexer_k_norm, reader.LoadVector(indexer + ".k_norm.weight", dI));
    SY_ASSIGN_OR_RETURN(a.indexer_k_norm_bias, reader.LoadVector(indexer + ".k_norm.bias", dI));
    SY_ASSIGN_OR_RETURN(a.indexer_weights_proj,
                        reader.LoadMatrix(indexer + ".weights_proj.weight", c.index_n_heads, D));
  }
  SY_ASSIGN_OR_RETURN(w.post_attention_layernorm,
                      reader.LoadVector(p + ".post_attention_layernorm.weight", D));

  w.is_moe = c.IsMoeLayer(layer);
  if (!w.is_moe) {
    SY_ASSIGN_OR_RETURN(w.mlp, LoadFeedForward(reader, p + ".mlp", c.intermediate_size, D));
    return w;
  }
  MoeWeights& moe = w.moe;
  SY_ASSIGN_OR_RETURN(moe.gate, reader.LoadMatrix(p + ".mlp.gate.weight", c.n_routed_experts, D,
                                                  /*may_be_fp8=*/false));
  const std::string bias_name = p + ".mlp.gate.e_score_correction_bias";
  if (c.topk_method == TopkMethod::kNoauxTc) {
    SY_ASSIGN_OR_RETURN(moe.e_score_correction_bias,
                        reader.LoadVector(bias_name, c.n_routed_experts));
  } else if (reader.Find(bias_name) != nullptr) {
    return Status::Errorf("tensor '{}' is present but topk_method does not use a correction bias",
                          bias_name);
  }
  const int64_t begin = options.expert_begin;
  const int64_t end = options.expert_end < 0 ? c.n_routed_experts : options.expert_end;
  std::vector<int32_t> held;
  if (options.placement != nullptr) {
    const std::vector<int32_t>* slots = options.placement->Layer(layer);
    if (slots == nullptr)
      return Status::Errorf("the expert placement has no layer {} (a MoE layer{})", layer,
                            layer >= c.num_hidden_layers ? ", the MTP block" : "");
    held = HeldExperts(*slots, options.placement->slots_per_rank, options.placement_rank);
  } else {
    for (int64_t e = begin; e < end; ++e)
      held.push_back(static_cast<int32_t>(e));
  }
  moe.experts.resize(static_cast<size_t>(c.n_routed_experts));
  for (int64_t e : held) {
    SY_ASSIGN_OR_RETURN(moe.experts[e],
                        LoadFeedForward(reader, p + ".mlp.experts." + std::to_string(e),
                                        c.moe_intermediate_size, D));
  }
  if (c.n_shared_experts > 0) {
    SY_ASSIGN_OR_RETURN(moe.shared_experts, LoadFeedForward(reader, p + ".mlp.shared_experts",
                                                            c.shared_expert_width(), D));
  }
  return w;
}

// Packs `m` and gives back its mapped checkpoint pages: the kernels read only the packed copy,
// so resident memory holds the weights once.
// `exact` keeps the layout of the checkpoint's type even under --int8-products (the router: its
// choices are discrete, and its matrix is small), and packs for its f32 product.
void PackMatrix(Matrix& m, bool exact = false) {
  if (!CanPack(m)) return;
  m.packed = exact ? PackForF32Products(m) : PackForLoad(m);
  MappedFile::ReleaseRange(m.data, static_cast<size_t>(m.rows) * m.RowBytes());
}

// An int4 checkpoint's weights are repacked into owned GGML blocks at load (HF_INT4_G128, or Q4_0
// for groups of 32); once in panels nothing reads the row-major blocks of an MLP's matrices
// (head sharding reads only attention's), so they are dropped: resident memory holds the weights
// once.
void DropRepackedRows(Matrix& m) {
  if (m.packed && m.rows_dropped_when_packed) {
    m.data = nullptr;
    m.owner.reset();
  }
}

void PackFeedForward(FeedForwardWeights& ff) {
  for (Matrix* m : {&ff.gate_proj, &ff.up_proj, &ff.down_proj}) {
    PackMatrix(*m);
    DropRepackedRows(*m);
  }
}

// A per-head matrix of the absorbed form, packed. Only the panels are read from then on, so the
// row-major copy it was packed from is dropped. Under `--int8-products` it is packed as int8
// like the checkpoint's matrices.
void PackAbsorbed(Matrix& m) {
  const bool int8 = GlobalWeightPacking() == WeightPacking::kInt8 && m.cols % kInt8QuadCols == 0;
  // These products keep f32 activations (LinearPanelsF32): q·W_UK feeds the softmax, where
  // bf16-rounded activations moved a logit by 2.5 at one decode step of the bf16 test checkpoint.
  // bf16 in pairs where the tiles run (PackForF32Products): each row goes through them as three
  // exact bf16 parts. At 32 decode rows of the bench model, 4.9% of a step on the f32 kernel,
  // 3.8% so (Xeon with AMX; a K of 64 keeps the tiles far from their peak).
  m.packed = int8 ? PackInt8(m) : PackForF32Products(m);
  m.data = nullptr;
  m.block_scales = nullptr;
  m.owner.reset();
}

// An f32 matrix of `rows` × `cols` values produced by value(r, c): the absorbed form where
// kv_b_proj's own dtype cannot hold it (fp8 whose scale blocks do not cover a head's rows whole).
template <typename Value>
Matrix F32Absorbed(int64_t rows, int64_t cols, Value value) {
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      values[r * cols + c] = value(r, c);
  Matrix m = OwnedF32Matrix(std::move(values), rows, cols);
  PackAbsorbed(m);
  return m;
}

// A matrix in kv_b_proj's own element type (fp8 or bf16) of `rows` × `cols` elements, element
// (r, c) being kv_b_proj's element source(r, c) = (row, col); fp8 with a scale per 16 rows and
// `block_cols` columns, scale(r, c) giving it. Same values as kv_b_proj's, 1 or 2 bytes each.
template <typename Source, typename Scale>
Matrix SameTypeAbsorbed(const Matrix& kv_b, int64_t rows, int64_t cols, int64_t block_cols,
                        Source source, Scale scale) {
  struct Storage {
    std::vector<uint8_t> bytes;
    std::vector<float> scales;
  };
  auto storage = std::make_shared<Storage>();
  const size_t element = DTypeSize(kv_b.dtype);
  storage->bytes.resize(static_cast<size_t>(rows * cols) * element);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const auto [row, col] = source(r, c);
      std::memcpy(storage->bytes.data() + static_cast<size_t>(r * cols + c) * element,
                  kv_b.data + static_cast<size_t>(row) * kv_b.RowBytes() + col * element, element);
    }
  Matrix m;
  m.dtype = kv_b.dtype;
  m.rows = rows;
  m.cols = cols;
  m.data = storage->bytes.data();
  if (kv_b.dtype == DType::kF8E4M3) {
    m.block_rows = kPanelRows;
    m.block_cols = block_cols;
    m.scale_cols = (cols + block_cols - 1) / block_cols;
    for (int64_t r = 0; r < rows; r += kPanelRows)
      for (int64_t c = 0; c < cols; c += block_cols)
        storage->scales.push_back(scale(r, c));
    m.block_scales = storage->scales.data();
  }
  m.owner = storage;
  PackAbsorbed(m);
  return m;
}

// The absorbed form's per-head matrices out of kv_b_proj ([H·(dn+dv), latent], head-major):
// W_UK[h] = rows [h·(dn+dv), +dn), used transposed; W_UV[h] = the next dv rows. Every decode
// step reads them, so they keep kv_b_proj's element type, exact: fp8 with its block scales
// (DeepSeek-V3: 17 MB a layer where f32 took 67, 8% of a one-sequence step's bytes) or bf16.
// fp8 needs each head's dn rows inside one scale block and its dv rows in whole 16-row panels
// of one block each; where they are not, and for f32 checkpoints, the matrices are f32.
void SplitKvB(const ModelConfig& c, AttentionWeights& a) {
  const Matrix& kv_b = a.kv_b_proj;
  const int64_t dn = c.qk_nope_head_dim, dv = c.v_head_dim, latent = c.kv_lora_rank;
  auto block_row = [&](int64_t row) { return (kv_b.first_row + row) / kv_b.block_rows; };
  auto scale = [&](int64_t row, int64_t col) {
    return kv_b.block_scales[block_row(row) * kv_b.scale_cols + col / kv_b.block_cols];
  };
  bool same_type = kv_b.dtype == DType::kBF16 || kv_b.dtype == DType::kF8E4M3;
  if (kv_b.dtype == DType::kF8E4M3) {
    same_type = kv_b.block_cols % kPanelRows == 0 && kv_b.block_rows % kPanelRows == 0;
    for (int64_t h = 0; h < c.num_attention_heads && same_type; ++h) {
      const int64_t first = h * (dn + dv);
      same_type = block_row(first) == block_row(first + dn - 1) &&
                  (kv_b.first_row + first + dn) % kPanelRows == 0;
    }
  }
  // A GGUF with both per-head matrices as GGML blocks needs none derived from kv_b_proj (each
  // would be packed, then dropped, and hold its memory until the model goes).
  const bool both_native = CanPackGgml(a.gguf_k_b) && CanPackGgml(a.gguf_v_b);
  if (both_native) {
    a.w_uk_t.resize(static_cast<size_t>(c.num_attention_heads));
    a.w_uv.resize(static_cast<size_t>(c.num_attention_heads));
  }
  std::vector<float> rows(static_cast<size_t>((dn + dv) * latent));
  for (int64_t h = 0; h < c.num_attention_heads && !both_native; ++h) {
    const int64_t first = h * (dn + dv);
    if (same_type) {
      // W_UKᵀ [latent][dn]: element (r, col) is kv_b_proj's (first + col, r); its scale
      // block is kv_b_proj's (block of row first, block of column r).
      a.w_uk_t.push_back(SameTypeAbsorbed(
          kv_b, latent, dn, dn,
          [&](int64_t r, int64_t col) { return std::pair<int64_t, int64_t>(first + col, r); },
          [&](int64_t r, int64_t) { return scale(first, r); }));
      a.w_uv.push_back(SameTypeAbsorbed(
          kv_b, dv, latent, kv_b.block_cols,
          [&](int64_t r, int64_t col) { return std::pair<int64_t, int64_t>(first + dn + r, col); },
          [&](int64_t r, int64_t col) { return scale(first + dn + r, col); }));
      continue;
    }
    for (int64_t r = 0; r < dn + dv; ++r)
      kv_b.DecodeRow(first + r, rows.data() + r * latent);
    a.w_uk_t.push_back(
        F32Absorbed(latent, dn, [&](int64_t r, int64_t col) { return rows[col * latent + r]; }));
    a.w_uv.push_back(F32Absorbed(
        dv, latent, [&](int64_t r, int64_t col) { return rows[(dn + r) * latent + col]; }));
  }
  // A GGUF's own per-head matrices, where it has them as GGML blocks: the same values, a quarter
  // of f32's bytes or less, read every decode step.
  auto native = [](Matrix& blocks, int64_t head_rows, std::vector<Matrix>& heads) {
    if (!CanPackGgml(blocks)) return;
    for (size_t h = 0; h < heads.size(); ++h) {
      Matrix m = blocks.RowSlice(static_cast<int64_t>(h) * head_rows, head_rows);
      m.packed = PackGgml(m);
      m.data = nullptr;  // only the panels are read (as PackAbsorbed leaves them)
      heads[h] = std::move(m);
    }
    MappedFile::ReleaseRange(blocks.data, static_cast<size_t>(blocks.rows) * blocks.RowBytes());
    blocks = Matrix{};
  };
  native(a.gguf_k_b, latent, a.w_uk_t);
  native(a.gguf_v_b, dv, a.w_uv);
}

void PackLayer(const ModelConfig& config, DecoderLayerWeights& layer) {
  AttentionWeights& a = layer.self_attn;
  SplitKvB(config, a);
  // kv_b_proj too: the expanded (prefill) form multiplies every cached latent by it.
  for (Matrix* m :
       {&a.q_a_proj, &a.q_b_proj, &a.q_proj, &a.kv_a_proj_with_mqa, &a.kv_b_proj, &a.o_proj})
    PackMatrix(*m);
  // The indexer's products keep their inputs to f32 (kernels::LinearF32), as the router's do:
  // which keys a query attends to turns on the order of its scores, and rounding activations to
  // bf16 where the CPU has the bf16 kernels would let near ties go differently from one CPU to
  // the next. They are small beside the attention's own (wq_b is a third of q_b_proj).
  for (Matrix* m : {&a.indexer_wq_b, &a.indexer_wk, &a.indexer_weights_proj})
    PackMatrix(*m, /*exact=*/true);
  PackFeedForward(layer.mlp);
  PackMatrix(layer.moe.gate, /*exact=*/true);
  for (auto& expert : layer.moe.experts)
    if (!expert.empty()) PackFeedForward(expert);
  if (!layer.moe.shared_experts.empty()) PackFeedForward(layer.moe.shared_experts);
}

// Rows [begin, begin + count) as a packed matrix of their own (head boundaries need not fall on
// fp8 block or panel boundaries).
Matrix CopyRows(const Matrix& m, int64_t begin, int64_t count) {
  // GGML blocks: a row is whole blocks, so any row range is a GGUF matrix as it is — read in place
  // from the mapped file and packed for the quantized kernels, as the whole matrix was.
  if (CanPackGgml(m)) {
    Matrix out = m.RowSlice(begin, count);
    out.packed = PackGgml(out);
    MappedFile::ReleaseRange(out.data, static_cast<size_t>(count) * out.RowBytes());
    return out;
  }
  // In m's own element type where the packed form allows it (bf16 and f16; fp8 where each 16-row
  // panel of the copy lies in one of m's scale blocks, given a scale per 16 rows): a rank's head
  // shard then multiplies on the kernel the whole matrix takes, a row's result the same bits as
  // in one process (an f32 copy took the f32 kernel where the whole took the bf16 dot kernel).
  const int64_t first = m.first_row + begin;
  const bool fp8_whole_panels =
      m.dtype == DType::kF8E4M3 && first % kPanelRows == 0 && m.block_rows % kPanelRows == 0;
  if (m.dtype == DType::kBF16 || m.dtype == DType::kF16 || fp8_whole_panels) {
    struct Storage {
      std::vector<uint8_t> bytes;
      std::vector<float> scales;
    };
    auto storage = std::make_shared<Storage>();
    const uint8_t* source = m.data + static_cast<size_t>(begin) * m.RowBytes();
    storage->bytes.assign(source, source + static_cast<size_t>(count) * m.RowBytes());
    Matrix out;
    out.dtype = m.dtype;
    out.rows = count;
    out.cols = m.cols;
    out.data = storage->bytes.data();
    if (fp8_whole_panels) {
      out.block_rows = kPanelRows;
      out.block_cols = m.block_cols;
      out.scale_cols = m.scale_cols;
      for (int64_t r = 0; r < count; r += kPanelRows) {
        const float* row = m.block_scales + ((first + r) / m.block_rows) * m.scale_cols;
        storage->scales.insert(storage->scales.end(), row, row + m.scale_cols);
      }
      out.block_scales = storage->scales.data();
    }
    out.owner = storage;
    out.packed = PackForLoad(out);
    return out;
  }
  std::vector<float> values(static_cast<size_t>(count * m.cols));
  for (int64_t r = 0; r < count; ++r)
    m.DecodeRow(begin + r, values.data() + r * m.cols);
  Matrix out = OwnedF32Matrix(std::move(values), count, m.cols);
  out.packed = Pack(out);
  return out;
}

// Whether columns [begin, begin + count) of GGML blocks are whole blocks: the only column ranges
// the quantized form can hold (a block's codes share its d, dmin and sub-block scales).
bool WholeGgmlBlocks(const Matrix& m, int64_t begin, int64_t count) {
  if (!CanPackGgml(m)) return false;
  const int64_t block = GgmlTypeInfo(m.ggml_type)->block_size;
  return begin % block == 0 && count % block == 0;
}

// Columns [begin, begin + count) as a packed matrix of their own: GGML blocks kept as blocks where
// the range is whole blocks (WholeGgmlBlocks), else f32.
Matrix CopyColumns(const Matrix& m, int64_t begin, int64_t count) {
  if (WholeGgmlBlocks(m, begin, count)) {
    const GgmlTypeTraits traits = *GgmlTypeInfo(m.ggml_type);
    const size_t offset = static_cast<size_t>(begin / traits.block_size * traits.block_bytes);
    const size_t row_bytes = static_cast<size_t>(count / traits.block_size * traits.block_bytes);
    std::vector<uint8_t> blocks(static_cast<size_t>(m.rows) * row_bytes);
    for (int64_t r = 0; r < m.rows; ++r)
      std::memcpy(blocks.data() + r * row_bytes, m.data + r * m.RowBytes() + offset, row_bytes);
    Matrix out = m;
    out.cols = count;
    out.first_row = 0;
    out.data = blocks.data();
    out.packed = PackGgml(out);
    // Only the panels are read from here on (as the absorbed per-head matrices): the copy goes.
    out.data = nullptr;
    out.owner.reset();
    return out;
  }
  std::vector<float> values(static_cast<size_t>(m.rows * count));
  for (int64_t r = 0; r < m.rows; ++r)
    m.DecodeRow(r, begin, begin + count, values.data() + r * count);
  Matrix out = OwnedF32Matrix(std::move(values), m.rows, count);
  out.packed = Pack(out);
  return out;
}

// GGML matrices a head shard had to decode to f32, for the one line that says so.
struct DecodedShards {
  int64_t matrices = 0;
  double f32_bytes = 0;
  std::string first;  // the first one and why
};

void ShardLayerHeads(const ModelConfig& c, int tp_rank, int tp_size, bool keep_projections,
                     const std::string& name, AttentionWeights& a, DecodedShards& decoded) {
  const int64_t heads = c.num_attention_heads / tp_size, first = tp_rank * heads;
  const int64_t dqk = c.qk_head_dim(), kv = c.qk_nope_head_dim + c.v_head_dim, dv = c.v_head_dim;
  a.kv_b_proj = CopyRows(a.kv_b_proj, first * kv, heads * kv);
  if (!keep_projections) {
    if (!a.q_b_proj.empty()) a.q_b_proj = CopyRows(a.q_b_proj, first * dqk, heads * dqk);
    if (!a.q_proj.empty()) a.q_proj = CopyRows(a.q_proj, first * dqk, heads * dqk);
    if (a.o_proj.dtype == DType::kGgml && !WholeGgmlBlocks(a.o_proj, first * dv, heads * dv)) {
      const auto traits = GgmlTypeInfo(a.o_proj.ggml_type);
      if (decoded.matrices++ == 0)
        decoded.first = fmt::format(
            "{}.self_attn.o_proj: this rank's columns [{}, {}) cut {}'s "
            "{}-column blocks",
            name, first * dv, (first + heads) * dv, traits ? traits->name : "?",
            traits ? traits->block_size : 0);
      decoded.f32_bytes += 4.0 * static_cast<double>(a.o_proj.rows * heads * dv);
    }
    a.o_proj = CopyColumns(a.o_proj, first * dv, heads * dv);
  }
  if (!a.w_uk_t.empty()) {
    a.w_uk_t = std::vector<Matrix>(a.w_uk_t.begin() + first, a.w_uk_t.begin() + first + heads);
    a.w_uv = std::vector<Matrix>(a.w_uv.begin() + first, a.w_uv.begin() + first + heads);
  }
}

}  // namespace

std::string ShardAttentionHeads(const ModelConfig& config, int tp_rank, int tp_size,
                                bool keep_projections, ModelWeights& weights) {
  DecodedShards decoded;
  for (size_t i = 0; i < weights.layers.size(); ++i)
    ShardLayerHeads(config, tp_rank, tp_size, keep_projections, "model.layers." + std::to_string(i),
                    weights.layers[i].self_attn, decoded);
  for (size_t i = 0; i < weights.mtp.size(); ++i)
    ShardLayerHeads(config, tp_rank, tp_size, keep_projections,
                    "model.layers." + std::to_string(weights.layers.size() + i),
                    weights.mtp[i].block.self_attn, decoded);
  if (decoded.matrices == 0) return "";
  return fmt::format(
      "{} GGML matri{} of the tensor-parallel head shard decoded to f32 ({:.1f} MB on this rank; "
      "exact products there, the others' quantized activations): {}{}. A head shard keeps its "
      "blocks where its columns are whole blocks: --tp dividing the heads so that (heads / tp) · "
      "v_head_dim is a multiple of the block size",
      decoded.matrices, decoded.matrices == 1 ? "x" : "ces", decoded.f32_bytes / 1e6, decoded.first,
      decoded.matrices > 1 ? ", and the same in the other layers" : "");
}

void PackDecoderLayer(const ModelConfig& config, DecoderLayerWeights& layer) {
  PackLayer(config, layer);
}

void PackWeights(const ModelConfig& config, ModelWeights& weights) {
  for (auto& layer : weights.layers)
    PackLayer(config, layer);
  PackMatrix(weights.lm_head);
  for (auto& mtp : weights.mtp) {
    PackLayer(config, mtp.block);
    PackMatrix(mtp.eh_proj);
    PackMatrix(mtp.head);
  }
}

void PackRoutedExpert(FeedForwardWeights& expert) {
  PackFeedForward(expert);
}

Status LoadRoutedExperts(const Checkpoint& checkpoint, const ModelConfig& c, int64_t layer,
                         const std::vector<int32_t>& experts, bool pack, MoeWeights& moe) {
  TensorReader reader(checkpoint, c);
  std::vector<bool> wanted(moe.experts.size(), false);
  for (int32_t e : experts)
    wanted[e] = true;
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
  for (size_t e = 0; e < moe.experts.size(); ++e) {
    if (!wanted[e]) {
      moe.experts[e] = FeedForwardWeights();  // frees its packed panels
      continue;
    }
    if (!moe.experts[e].empty()) continue;
    SY_ASSIGN_OR_RETURN(moe.experts[e], LoadFeedForward(reader, p + std::to_string(e),
                                                        c.moe_intermediate_size, c.hidden_size));
    if (pack) PackFeedForward(moe.experts[e]);
  }
  return Status::Ok();
}

Result<ModelWeights> LoadWeights(const Checkpoint& checkpoint, const ModelConfig& c,
                                 const WeightLoadOptions& options,
                                 std::vector<std::string>* unused) {
  if (options.expert_begin < 0 ||
      (options.expert_end >= 0 &&
       (options.expert_end < options.expert_begin || options.expert_end > c.n_routed_experts)))
    return Status::Errorf("expert range [{}, {}) is outside [0, {})", options.expert_begin,
                          options.expert_end, c.n_routed_experts);
  TensorReader reader(checkpoint, c);
  ModelWeights w;
  const int64_t D = c.hidden_size;
  SY_ASSIGN_OR_RETURN(w.embed_tokens,
                      reader.LoadMatrix("model.embed_tokens.weight", c.vocab_size, D, false));
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    SY_ASSIGN_OR_RETURN(auto layer_weights, LoadDecoderLayer(reader, c, layer, options));
    w.layers.push_back(std::move(layer_weights));
  }
  SY_ASSIGN_OR_RETURN(w.norm, reader.LoadVector("model.norm.weight", D));
  SY_ASSIGN_OR_RETURN(w.lm_head, reader.LoadMatrix("lm_head.weight", c.vocab_size, D, false));

  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) {
    const int64_t layer = c.num_hidden_layers + i;
    const std::string p = "model.layers." + std::to_string(layer);
    if (reader.Find(p + ".eh_proj.weight") == nullptr) {
      // A checkpoint may ship without its MTP module (HF's save_pretrained drops it).
      continue;
    }
    MtpWeights mtp;
    mtp.embed_tokens = w.embed_tokens;
    mtp.head = w.lm_head;
    if (reader.Find(p + ".embed_tokens.weight")) {
      SY_ASSIGN_OR_RETURN(mtp.embed_tokens,
                          reader.LoadMatrix(p + ".embed_tokens.weight", c.vocab_size, D, false));
    }
    if (reader.Find(p + ".shared_head.head.weight")) {
      SY_ASSIGN_OR_RETURN(
          mtp.head, reader.LoadMatrix(p + ".shared_head.head.weight", c.vocab_size, D, false));
    }
    SY_ASSIGN_OR_RETURN(mtp.enorm, reader.LoadVector(p + ".enorm.weight", D));
    SY_ASSIGN_OR_RETURN(mtp.hnorm, reader.LoadVector(p + ".hnorm.weight", D));
    SY_ASSIGN_OR_RETURN(mtp.eh_proj, reader.LoadMatrix(p + ".eh_proj.weight", D, 2 * D));
    SY_ASSIGN_OR_RETURN(mtp.head_norm, reader.LoadVector(p + ".shared_head.norm.weight", D));
    SY_ASSIGN_OR_RETURN(mtp.block, LoadDecoderLayer(reader, c, layer, options));
    w.mtp.push_back(std::move(mtp));
  }

  if (unused != nullptr) {
    unused->clear();
    for (const auto& [name, tensor] : checkpoint.tensors())
      if (!reader.used().count(name)) unused->push_back(name);
  }
  return w;
}

}  // namespace sy
