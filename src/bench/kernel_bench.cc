#include "bench/kernel_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "base/clock.h"
#include "base/thread_pool.h"
#include "bench/onednn_matmul.h"
#include "bench/random_weights.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/grouped_ffn.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/mla_decode.h"
#include "kernels/cpu/onednn_linear.h"
#include "model/latent_cache.h"
#include "model/mla.h"
#include "model/rope.h"
#include "model/sparse_attention.h"
#include "model/synthetic.h"
#include "tensor/ggml_quants.h"

namespace sy::bench {
namespace {

// DeepSeek-V3 (spec §3.1).
constexpr int64_t kHidden = 7168, kExpertWidth = 2048, kDenseWidth = 18432, kHeads = 128,
                  kLatent = 512, kRope = 64, kQLora = 1536, kTopK = 8;

double MedianTime(int repetitions, const std::function<void()>& body) {
  body();  // warm-up: page faults, thread wake-up
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    const double start = NowSeconds();
    body();
    times.push_back(NowSeconds() - start);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<float> RandomActivations(size_t count) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(count);
  for (float& x : v)
    x = normal(rng);
  return v;
}

// The compute peak a kernel path is judged by.
double PathPeak(const MachinePeaks& peaks, const std::string& path) {
  // AMX paths against the tile multiply's peak ("amx-bf16"; "int8-amx", "ggml-amx").
  if (path.rfind("amx-bf16", 0) == 0 && peaks.amx_bf16_gflops > 0) return peaks.amx_bf16_gflops;
  if (path.find("-amx") != std::string::npos && peaks.amx_int8_gops > 0) return peaks.amx_int8_gops;
  if (path.rfind("int8", 0) == 0 || path.rfind("ggml", 0) == 0)
    return peaks.int8_gops > 0 ? peaks.int8_gops : peaks.f32_gflops;
  return path != "panel-f32" ? peaks.bf16_gflops : peaks.f32_gflops;
}

const char* WeightName(const PackedMatrix& w) {
  if (w.dtype == DType::kGgml) return w.ggml_type == GgmlType::kQ6_K ? "q6_k" : "q4_k";
  if (w.bf16_pairs) return "bf16-pairs";
  return w.dtype == DType::kI8 ? "int8" : w.dtype == DType::kF8E4M3 ? "fp8" : "bf16";
}

struct Shape {
  const char* name;
  int64_t n, k;
  DType dtype;
  GgmlType ggml_type = GgmlType::kF32;  // dtype kGgml: the blocks' type
};

Matrix RandomWeights(const Shape& shape, uint64_t seed) {
  return shape.dtype == DType::kGgml ? RandomGgmlMatrix(shape.ggml_type, shape.n, shape.k, seed)
                                     : RandomPackedMatrix(shape.dtype, shape.n, shape.k, seed);
}

// Our products, or with onednn_blocks oneDNN's on the same packed weights dequantized a block at a
// time in every call (kernels/cpu/onednn_linear.h: what --prefill-gemm onednn runs).
void BenchLinear(const MachinePeaks& peaks, const KernelBenchOptions& options, const Shape& shape,
                 const std::vector<int64_t>& ms, std::vector<KernelResult>& out,
                 bool onednn_blocks = false) {
  // Enough distinct copies that one pass streams more than the last-level cache holds (the bytes
  // as packed: int8 under --int8-products).
  std::vector<Matrix> weights = {RandomWeights(shape, 100)};
  const double one = weights[0].packed->StoredBytes();
  const int copies = static_cast<int>(std::max(1.0, std::ceil(options.stream_bytes / one)));
  for (int c = 1; c < copies; ++c)
    weights.push_back(RandomWeights(shape, 100 + c));
  for (int64_t m : ms) {
    auto x = RandomActivations(static_cast<size_t>(m * shape.k));
    std::vector<float> y(static_cast<size_t>(m * shape.n));
    const double seconds = MedianTime(options.repetitions,
                                      [&] {
                                        for (const auto& w : weights) {
                                          if (onednn_blocks) {
                                            kernels::OnednnLinear(x.data(), m, *w.packed, y.data());
                                          } else {
                                            kernels::LinearPacked(x.data(), m, *w.packed, y.data());
                                          }
                                        }
                                      }) /
                           copies;
    KernelResult r;
    const bool bf16 = kernels::OnednnRunsBf16();
    const std::string path = onednn_blocks ? fmt::format("onednn-blocks {}", bf16 ? "bf16" : "f32")
                                           : kernels::KernelPathName(m, *weights[0].packed);
    r.kernel = m >= 256 ? "gemm" : "gemv";
    r.weight_dtype = WeightName(*weights[0].packed);
    r.path = fmt::format("{} {}", shape.name, path);
    r.m = m;
    r.n = shape.n;
    r.k = shape.k;
    r.seconds = seconds;
    r.bytes = one + (static_cast<double>(m) * shape.k + static_cast<double>(m) * shape.n) * 4;
    r.flops = 2.0 * m * shape.n * shape.k;
    Score(r, peaks,
          onednn_blocks ? (bf16 ? peaks.bf16_gflops : peaks.f32_gflops) : PathPeak(peaks, path));
    out.push_back(r);
  }
}

void BenchGrouped(const MachinePeaks& peaks, const KernelBenchOptions& options, int64_t groups,
                  const std::vector<int64_t>& row_counts, std::vector<KernelResult>& out,
                  DType dtype = DType::kF8E4M3) {
  std::vector<Matrix> gate, up, down;
  std::vector<kernels::ExpertPanels> experts;
  for (int64_t e = 0; e < groups; ++e) {
    gate.push_back(RandomPackedMatrix(dtype, kExpertWidth, kHidden, 1000 + 3 * e));
    up.push_back(RandomPackedMatrix(dtype, kExpertWidth, kHidden, 1001 + 3 * e));
    down.push_back(RandomPackedMatrix(dtype, kHidden, kExpertWidth, 1002 + 3 * e));
  }
  for (int64_t e = 0; e < groups; ++e)
    experts.push_back({gate[e].packed.get(), up[e].packed.get(), down[e].packed.get()});
  const double expert_bytes = 2 * gate[0].packed->StoredBytes() + down[0].packed->StoredBytes();
  for (int64_t rows : row_counts) {
    // Rows spread evenly over the experts, as balanced routing delivers them.
    std::vector<int64_t> offsets(static_cast<size_t>(groups + 1), 0);
    for (int64_t e = 0; e < groups; ++e)
      offsets[e + 1] = offsets[e] + rows / groups + (e < rows % groups ? 1 : 0);
    const int64_t active = std::min(rows, groups);
    auto x = RandomActivations(static_cast<size_t>(rows * kHidden));
    std::vector<float> y(x.size());
    const double seconds = MedianTime(options.repetitions, [&] {
      kernels::GroupedExpertFfn(x.data(), offsets, experts, kHidden, y.data());
    });
    KernelResult r;
    const std::string path = kernels::KernelPathName(rows / groups, *experts[0].gate);
    r.kernel = "grouped_gemm";
    r.weight_dtype = WeightName(*experts[0].gate);
    r.path = path;
    r.m = rows;
    r.n = kExpertWidth;
    r.k = kHidden;
    r.groups = groups;
    r.seconds = seconds;
    r.bytes =
        active * expert_bytes + static_cast<double>(rows) * (2 * kHidden + 3 * kExpertWidth) * 4;
    r.flops = 2.0 * rows * 3 * kHidden * kExpertWidth;
    Score(r, peaks, PathPeak(peaks, path));
    out.push_back(r);
  }
}

// The flash-decode kernel over a bf16 or an fp8 cache (latent_row.h) of random rows.
void BenchMlaDecode(const MachinePeaks& peaks, const KernelBenchOptions& options, int64_t batch,
                    int64_t kv_len, int64_t query_len, DType cache_dtype,
                    std::vector<KernelResult>& out) {
  const int64_t width = kLatent + kRope, page = 64;
  const int64_t pages_per_request = (kv_len + page - 1) / page;
  const kernels::LatentRowLayout layout = kernels::LatentRowLayout::Of(cache_dtype, width, kLatent);
  const int64_t rows = batch * pages_per_request * page;
  std::vector<uint8_t> pool(static_cast<size_t>(rows * layout.row_bytes));
  {
    const auto values = RandomActivations(static_cast<size_t>(page * width));
    for (int64_t r = 0; r < rows; ++r)
      kernels::EncodeLatentRow(layout, values.data() + (r % page) * width,
                               pool.data() + r * layout.row_bytes);
  }
  std::vector<int32_t> table(static_cast<size_t>(batch * pages_per_request));
  for (size_t i = 0; i < table.size(); ++i)
    table[i] = static_cast<int32_t>(i);
  const int64_t tokens = batch * query_len;
  auto q_latent = RandomActivations(static_cast<size_t>(tokens * kHeads * kLatent));
  auto q_pe = RandomActivations(static_cast<size_t>(tokens * kHeads * kRope));
  std::vector<float> o(q_latent.size());
  std::vector<int64_t> positions;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < query_len; ++t)
      positions.push_back(kv_len - query_len + t);
  ThreadPool& pool_threads = ThreadPool::Global();
  const int64_t head_block = std::max<int64_t>(1, kHeads / pool_threads.size());
  const int64_t items = batch * ((kHeads + head_block - 1) / head_block);
  const double seconds = MedianTime(options.repetitions, [&] {
    pool_threads.ParallelFor(static_cast<size_t>(items), [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const int64_t b = static_cast<int64_t>(i) / ((kHeads + head_block - 1) / head_block);
        const int64_t h0 =
            (static_cast<int64_t>(i) % ((kHeads + head_block - 1) / head_block)) * head_block;
        kernels::LatentPages view{pool.data(), layout, page, table.data() + b * pages_per_request};
        const int64_t t0 = b * query_len;
        kernels::MlaDecodeAttention(
            q_latent.data() + t0 * kHeads * kLatent, q_pe.data() + t0 * kHeads * kRope, query_len,
            positions.data() + t0, view, kv_len, kHeads, h0, std::min(kHeads, h0 + head_block),
            kLatent, kRope, 0.135f, o.data() + t0 * kHeads * kLatent);
      }
    });
  });
  KernelResult r;
  r.kernel = "mla_decode";
  r.weight_dtype = cache_dtype == DType::kF8E4M3 ? "fp8" : "bf16";
  const bool bf16 = kernels::GlobalKernelOptions().bf16_dot &&
                    kernels::MlaDecodeBf16Applies(cache_dtype, kLatent, kRope);
  r.path = fmt::format("{}flash-decode q{} kv{}", bf16 ? "bf16-dot " : "", query_len, kv_len);
  r.m = tokens;
  r.n = kHeads;
  r.k = kv_len;
  r.groups = batch;
  r.seconds = seconds;
  r.bytes = static_cast<double>(batch) * kv_len * layout.row_bytes +
            tokens * kHeads * (width + kLatent) * 4.0;
  r.flops = 2.0 * tokens * kHeads * kv_len * (width + kLatent);
  Score(r, peaks, bf16 ? peaks.bf16_gflops : peaks.f32_gflops);
  out.push_back(r);
}

// MLA attention of one prompt chunk of `tokens` queries behind `prefix` cached keys, run by the
// model's own MlaAttend in the two forms it can give prompt rows (model/mla.h): expanded (kv_b
// expands every key the chunk sees, then flash attention per head) and absorbed (q·W_UK per
// head, the flash-decode kernel over the bf16 latent cache, then W_UV), each timed whole and
// scored by its own FLOPs. Their times side by side are what the choice between the forms rests
// on: expansion costs in the cached keys, the absorbed form in queries × keys.
void BenchMlaPrefill(const MachinePeaks& peaks, const KernelBenchOptions& options, int64_t prefix,
                     int64_t tokens, std::vector<KernelResult>& out) {
  const ModelConfig c = DeepSeekV3Config();
  const RopeParams rope = ComputeRopeParams(c);
  const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim;
  const int64_t latent = c.kv_lora_rank, width = c.latent_cache_width(), keys = prefix + tokens;
  AttentionWeights w;  // kv_b and its per-head split, as PackWeights makes them from fp8
  w.kv_b_proj = RandomPackedMatrix(DType::kF8E4M3, H * (nope + v), latent, 31);
  for (int64_t h = 0; h < H; ++h) {
    w.w_uk_t.push_back(RandomPackedMatrix(DType::kF8E4M3, latent, nope, 100 + h));
    w.w_uv.push_back(RandomPackedMatrix(DType::kF8E4M3, v, latent, 400 + h));
  }
  LatentCache cache(1, width, 64, (keys + 63) / 64, DType::kBF16);
  SequenceCache sequence;
  (void)cache.Reserve(sequence, keys);
  const auto rows = RandomActivations(static_cast<size_t>(keys * width));
  for (int64_t p = 0; p < keys; ++p)
    cache.Write(0, sequence, p, rows.data() + p * width);
  sequence.length = keys;
  sequence.prompt_end = keys;
  SequenceCache before = sequence;  // the chunk's view: the prefix cached, its rows written
  before.length = prefix;
  ForwardBatch batch;
  const std::vector<int32_t> ids(static_cast<size_t>(tokens), 7);
  batch.Add(ids.data(), tokens, &before);
  std::vector<int64_t> positions;
  for (int64_t t = 0; t < tokens; ++t)
    positions.push_back(prefix + t);
  const auto q = RandomActivations(static_cast<size_t>(tokens * H * c.qk_head_dim()));
  std::vector<float> heads_out(static_cast<size_t>(tokens * H * v));
  const double causal_pairs = static_cast<double>(tokens) * prefix + tokens * (tokens + 1) / 2.0;
  const bool bf16 = kernels::GlobalKernelOptions().bf16_dot &&
                    kernels::MlaDecodeBf16Applies(DType::kBF16, latent, c.qk_rope_head_dim);
  for (AttentionForm form : {AttentionForm::kExpanded, AttentionForm::kAbsorbed}) {
    KernelResult r;
    r.seconds = MedianTime(options.repetitions, [&] {
      MlaAttend(c, rope, w, 0, batch, positions, cache, form, q.data(), nullptr, heads_out.data());
    });
    const bool expanded = form == AttentionForm::kExpanded;
    r.flops =
        expanded
            ? 2.0 * keys * H * (nope + v) * latent + 2.0 * causal_pairs * H * (c.qk_head_dim() + v)
            : 2.0 * tokens * H * (nope + v) * latent + 2.0 * causal_pairs * H * (width + latent);
    r.path = fmt::format("{}{} p{}+{}", !expanded && bf16 ? "bf16-dot " : "",
                         expanded ? "expanded" : "absorbed", prefix, tokens);
    r.kernel = "mla_prefill";
    r.weight_dtype = "fp8";
    r.m = tokens;
    r.n = H;
    r.k = keys;
    r.groups = 1;
    Score(r, peaks, !expanded && bf16 ? peaks.bf16_gflops : peaks.f32_gflops);
    out.push_back(r);
  }
}

// DeepSeek-V3.2's sparse attention in decode (model/sparse_attention.h), one layer at V3.2's
// shapes over `batch` sequences of kv_len cached rows (bf16), one new token each, through the
// model's own MlaAttend: dense MLA over every key (V3's attention, the baseline beside it), the
// indexer's scoring and top-2048 choice alone, and DSA whole (the choice, then attention over
// the chosen keys). The indexer's products round each product (no FMA, index_scores.h): a
// multiply and an add for an FMA's two flops, which CPUs with separate add pipes (Zen) run at the
// FMA's rate; its roofline is the f32 FMA peak.
// `tokens` > 1: a prompt chunk of that many tokens ending at kv_len in each sequence (DSA's
// prefill: every query of the chunk chooses its own keys).
void BenchDsaDecode(const MachinePeaks& peaks, const KernelBenchOptions& options, int64_t batch,
                    int64_t kv_len, std::vector<KernelResult>& out, int64_t tokens = 1) {
  ModelConfig c = DeepSeekV3Config();
  c.model_type = "deepseek_v32";
  c.index_topk = 2048;
  c.index_head_dim = 128;
  c.index_n_heads = 64;
  const RopeParams rope = ComputeRopeParams(c);
  const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, v = c.v_head_dim;
  const int64_t latent = c.kv_lora_rank, width = c.latent_cache_width();
  const int64_t row = c.cache_row_width(), page = 64;
  AttentionWeights w;  // kv_b and its per-head split, as PackWeights makes them from fp8
  w.kv_b_proj = RandomPackedMatrix(DType::kF8E4M3, H * (nope + v), latent, 31);
  for (int64_t h = 0; h < H; ++h) {
    w.w_uk_t.push_back(RandomPackedMatrix(DType::kF8E4M3, latent, nope, 100 + h));
    w.w_uv.push_back(RandomPackedMatrix(DType::kF8E4M3, v, latent, 400 + h));
  }
  // MlaAttend takes a layer with an indexer for a DSA layer; its projections are not run here.
  w.indexer_wk = RandomPackedMatrix(DType::kBF16, c.index_head_dim, c.hidden_size, 7);
  const int64_t pages_per_sequence = (kv_len + page - 1) / page;
  LatentCache cache(1, row, page, batch * pages_per_sequence, DType::kBF16);
  std::vector<SequenceCache> sequences(static_cast<size_t>(batch));
  const auto rows = RandomActivations(static_cast<size_t>(4096 * row));
  ForwardBatch step;
  std::vector<int64_t> positions;
  std::vector<SequenceCache> views(static_cast<size_t>(batch));
  const std::vector<int32_t> ids(static_cast<size_t>(tokens), 7);
  for (int64_t b = 0; b < batch; ++b) {
    (void)cache.Reserve(sequences[b], kv_len);
    for (int64_t p = 0; p < kv_len; ++p)
      cache.Write(0, sequences[b], p, rows.data() + ((p * 31 + b * 977) % 4096) * row);
    sequences[b].length = kv_len;
    // The step's view: its own rows written, from kv_len - tokens on.
    views[b] = sequences[b];
    views[b].length = kv_len - tokens;
    views[b].prompt_end = tokens > 1 ? kv_len : kv_len - 1;
    step.Add(ids.data(), tokens, &views[b]);
    for (int64_t t = kv_len - tokens; t < kv_len; ++t)
      positions.push_back(t);
  }
  const int64_t queries = batch * tokens;
  const auto q = RandomActivations(static_cast<size_t>(queries * H * c.qk_head_dim()));
  const auto index_queries = RandomActivations(static_cast<size_t>(queries * IndexerQueryWidth(c)));
  std::vector<float> heads_out(static_cast<size_t>(queries * H * v));
  const bool bf16 = kernels::GlobalKernelOptions().bf16_dot &&
                    kernels::MlaDecodeBf16Applies(DType::kBF16, latent, c.qk_rope_head_dim);
  const auto attention = [&](int64_t keys) {
    KernelResult r;
    r.kernel = "dsa_decode";
    r.weight_dtype = "bf16";
    r.m = queries;
    r.n = H;
    r.k = keys;
    r.groups = batch;
    r.flops = 2.0 * queries * (H * (nope + v) * latent + H * keys * (width + latent));
    r.bytes = static_cast<double>(queries) * keys * width * 2;
    return r;
  };
  // Dense, each query over the keys up to itself.
  const double pairs = static_cast<double>(batch) * tokens * (kv_len - (tokens - 1) / 2.0);
  KernelResult dense = attention(kv_len);
  if (tokens > 1) {
    dense.kernel = "dsa_prefill";
    dense.bytes = static_cast<double>(batch) * kv_len * width * 2;
    // Prompt rows this far in take the absorbed form where the bf16 MLA kernel runs, else the
    // expanded one: every key the chunk sees expanded by kv_b, then causal attention per head.
    dense.flops = bf16
                      ? 2.0 * queries * H * (nope + v) * latent + 2.0 * pairs * H * (width + latent)
                      : 2.0 * batch * kv_len * latent * H * (nope + v) +
                            2.0 * pairs * H * (c.qk_head_dim() + v);
  }
  dense.seconds = MedianTime(options.repetitions, [&] {
    MlaAttend(c, rope, w, 0, step, positions, cache, AttentionForm::kAuto, q.data(), nullptr,
              heads_out.data());
  });
  const std::string chunk = tokens > 1 ? fmt::format(" chunk{}", tokens) : "";
  dense.path = fmt::format("{}dense MLA kv{}{}", bf16 ? "bf16-dot " : "", kv_len, chunk);
  Score(dense, peaks, bf16 ? peaks.bf16_gflops : peaks.f32_gflops);
  out.push_back(dense);

  KernelResult indexer;
  indexer.kernel = tokens > 1 ? "dsa_prefill" : "dsa_decode";
  indexer.weight_dtype = "bf16";
  indexer.m = queries;
  indexer.n = c.index_n_heads;
  indexer.k = kv_len;
  indexer.groups = batch;
  indexer.seconds = MedianTime(options.repetitions, [&] {
    (void)SelectSparseKeys(c, 0, step, positions, cache, index_queries.data());
  });
  // Each query scores the keys up to its own position.
  indexer.flops = 2.0 * pairs * c.index_n_heads * c.index_head_dim;
  indexer.bytes = static_cast<double>(batch) * kv_len * c.index_head_dim * 2;
  indexer.path = fmt::format("indexer top{} of kv{}{} ({:.0f}% of dense)", c.index_topk, kv_len,
                             chunk, 100 * indexer.seconds / dense.seconds);
  Score(indexer, peaks, peaks.f32_gflops);
  out.push_back(indexer);

  KernelResult sparse = attention(c.index_topk);
  sparse.kernel = indexer.kernel;
  sparse.flops += indexer.flops;
  sparse.bytes += indexer.bytes;
  sparse.seconds = MedianTime(options.repetitions, [&] {
    MlaAttend(c, rope, w, 0, step, positions, cache, AttentionForm::kAuto, q.data(),
              index_queries.data(), heads_out.data());
  });
  sparse.path = fmt::format("{}DSA top{} of kv{}{} ({:.2f}x dense)", bf16 ? "bf16-dot " : "",
                            c.index_topk, kv_len, chunk, dense.seconds / sparse.seconds);
  Score(sparse, peaks, bf16 ? peaks.bf16_gflops : peaks.f32_gflops);
  out.push_back(sparse);
}

// oneDNN's bf16 matmul (f32 where the CPU has no bf16 one) on the same shape and row counts,
// scored against the matching peak; each of our rows with that shape and m gets the ratio of its
// GFLOP/s to oneDNN's.
void BenchOnednn(const MachinePeaks& peaks, const KernelBenchOptions& options, const Shape& shape,
                 const std::vector<int64_t>& ms, std::vector<KernelResult>& out) {
  const double one = static_cast<double>(shape.n) * shape.k * 2;
  const int copies = static_cast<int>(std::max(1.0, std::ceil(options.stream_bytes / one)));
  OnednnMatmul onednn(shape.n, shape.k, copies, peaks.threads);
  for (int64_t m : ms) {
    KernelResult r;
    r.seconds = onednn.MedianSeconds(m, options.repetitions);
    r.kernel = m >= 256 ? "gemm" : "gemv";
    const double element = onednn.bf16() ? 2 : 4;
    r.weight_dtype = onednn.bf16() ? "bf16" : "f32";
    r.path = fmt::format("onednn {}", shape.name);
    r.implementation = onednn.implementation();
    r.m = m;
    r.n = shape.n;
    r.k = shape.k;
    r.bytes = one / 2 * element +
              (static_cast<double>(m) * shape.k * element + static_cast<double>(m) * shape.n * 4);
    r.flops = 2.0 * m * shape.n * shape.k;
    Score(r, peaks, onednn.bf16() ? peaks.bf16_gflops : peaks.f32_gflops);
    const std::string ours = fmt::format("{} ", shape.name);
    for (auto& mine : out)
      if (mine.m == m && mine.n == shape.n && mine.k == shape.k && mine.path.rfind(ours, 0) == 0)
        mine.vs_onednn = mine.gflops / r.gflops;
    out.push_back(r);
  }
}

}  // namespace

void Score(KernelResult& r, const MachinePeaks& peaks, double peak_gflops) {
  r.gbps = r.bytes / r.seconds / 1e9;
  r.gflops = r.flops / r.seconds / 1e9;
  const double intensity = r.flops / r.bytes;
  r.roofline_fraction = r.gflops / std::min(peak_gflops, intensity * peaks.read_gbps);
}

std::vector<KernelResult> BenchKernels(const MachinePeaks& peaks,
                                       const KernelBenchOptions& options) {
  std::vector<KernelResult> out;
  // GGUF Q4_K_M's two types (kernels/cpu/ggml_gemm.h) at decode's row counts: at m = 1 they are
  // bound by the bytes they read, so their roofline fraction is their share of read bandwidth.
  const std::vector<Shape> ggml_shapes = {
      {"expert_gate", kExpertWidth, kHidden, DType::kGgml, GgmlType::kQ4_K},
      {"expert_down", kHidden, kExpertWidth, DType::kGgml, GgmlType::kQ4_K},
      {"o_proj", kHidden, kHeads * 128, DType::kGgml, GgmlType::kQ4_K},
      {"expert_gate", kExpertWidth, kHidden, DType::kGgml, GgmlType::kQ6_K},
      {"expert_down", kHidden, kExpertWidth, DType::kGgml, GgmlType::kQ6_K},
  };
  const std::vector<int64_t> ggml_m =
      options.quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 2, 8, 32};
  const std::vector<int64_t> dsa_kv =
      options.quick ? std::vector<int64_t>{16384} : std::vector<int64_t>{4096, 16384, 65536};
  const std::vector<int64_t> dsa_prefill_kv =
      options.quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 16384};
  if (options.dsa_only) {
    for (int64_t kv_len : dsa_kv)
      BenchDsaDecode(peaks, options, 4, kv_len, out);
    // A prompt's chunk of 512 past the first 2,048 tokens (every query sparse).
    for (int64_t kv_len : dsa_prefill_kv)
      BenchDsaDecode(peaks, options, 1, kv_len, out, 512);
    return out;
  }
  if (options.mla_only) {
    for (int64_t batch : {1, 4, 16})
      for (DType cache_dtype : {DType::kBF16, DType::kF8E4M3})
        BenchMlaDecode(peaks, options, batch, 5000, 1, cache_dtype, out);
    for (DType cache_dtype : {DType::kBF16, DType::kF8E4M3})
      BenchMlaDecode(peaks, options, 4, 32768, 1, cache_dtype, out);
    return out;
  }
  if (options.ggml_only) {
    for (const auto& shape : ggml_shapes)
      BenchLinear(peaks, options, shape, ggml_m, out);
    return out;
  }
  const std::vector<int64_t> decode_m = options.quick
                                            ? std::vector<int64_t>{1, 8, 32, 128}
                                            : std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128};
  const std::vector<int64_t> prefill_m =
      options.quick ? std::vector<int64_t>{256} : std::vector<int64_t>{256, 512};
  std::vector<Shape> shapes = {
      {"o_proj", kHidden, kHeads * 128, DType::kF8E4M3},
      {"expert_gate", kExpertWidth, kHidden, DType::kF8E4M3},
      {"expert_down", kHidden, kExpertWidth, DType::kF8E4M3},
      {"q_b_proj", kHeads * 192, kQLora, DType::kF8E4M3},
  };
  if (!options.quick) {
    shapes.push_back({"qkv_a_proj", kQLora + kLatent + kRope, kHidden, DType::kF8E4M3});
    shapes.push_back({"dense_gate", kDenseWidth, kHidden, DType::kF8E4M3});
    shapes.push_back({"dense_down", kHidden, kDenseWidth, DType::kF8E4M3});
    shapes.push_back({"o_proj_bf16", kHidden, kHeads * 128, DType::kBF16});
  }
  // Our kernels' rows are ours at every m (no --prefill-gemm choice); oneDNN has its own rows.
  const kernels::PrefillGemm prefill_gemm = kernels::GlobalPrefillGemm();
  kernels::GlobalPrefillGemm() = kernels::PrefillGemm::kOwn;
  // Where AMX runs: the fp8 products again on its bf16 tiles (--amx-bf16), beside the rows above.
  // (int8 and GGML products take AMX tiles by themselves from 16 rows.)
  const bool amx = kernels::ActiveAmxBackend() == kernels::AmxBackend::kHardware;
  // bf16 weights as the loader lays them out where AMX runs: as the tiles
  // (PackedMatrix::bf16_pairs).
  const Shape o_proj_pairs = {"o_proj_bf16", kHidden, kHeads * 128, DType::kBF16};
  auto amx_rows = [&] {
    kernels::GlobalKernelOptions().amx_bf16 = true;
    for (size_t i = 0; i < 2; ++i)
      BenchLinear(peaks, options, shapes[i], decode_m, out);
    BenchLinear(peaks, options, shapes[0], prefill_m, out);
    GlobalBf16Pairs() = true;
    BenchLinear(peaks, options, o_proj_pairs, decode_m, out);
    BenchLinear(peaks, options, o_proj_pairs, prefill_m, out);
    GlobalBf16Pairs() = false;
    kernels::GlobalKernelOptions().amx_bf16 = false;
  };
  const int64_t groups = options.quick ? 8 : 32;  // one EP rank's experts: EP32 quick, EP8 full
  auto amx_grouped_rows = [&] {
    kernels::GlobalKernelOptions().amx_bf16 = true;
    BenchGrouped(peaks, options, groups, {groups * 16, groups * 256}, out);
    GlobalBf16Pairs() = true;
    BenchGrouped(peaks, options, groups, {groups * 16, groups * 256}, out, DType::kBF16);
    GlobalBf16Pairs() = false;
    kernels::GlobalKernelOptions().amx_bf16 = false;
  };
  if (options.amx_only) {
    if (!amx)
      throw std::runtime_error(
          fmt::format("bench kernels --amx-only: this process cannot use AMX tiles (AMX: {})",
                      kernels::Amx().detail));
    amx_rows();
    amx_grouped_rows();
    std::vector<int64_t> onednn_m;
    for (int64_t m : decode_m)
      if (m >= 8) onednn_m.push_back(m);
    onednn_m.insert(onednn_m.end(), prefill_m.begin(), prefill_m.end());
    if (options.onednn) BenchOnednn(peaks, options, shapes[0], onednn_m, out);
    kernels::GlobalPrefillGemm() = prefill_gemm;
    return out;
  }
  for (const auto& shape : shapes)
    BenchLinear(peaks, options, shape, decode_m, out);
  BenchLinear(peaks, options, shapes[0], prefill_m, out);
  if (amx) amx_rows();
  if (!options.quick)  // every fp8 shape at the prefill row counts, o_proj's bf16 twin too
    for (const auto& shape : shapes)
      if (&shape != &shapes[0]) BenchLinear(peaks, options, shape, prefill_m, out);
  kernels::GlobalPrefillGemm() = prefill_gemm;

  // The routed experts of one EP rank.
  std::vector<int64_t> rows;
  for (int64_t batch :
       options.quick ? std::vector<int64_t>{1, 16, 128} : std::vector<int64_t>{1, 4, 16, 64, 128})
    rows.push_back(batch * kTopK);
  BenchGrouped(peaks, options, groups, rows, out);
  BenchGrouped(peaks, options, groups, {groups * 256}, out);  // prefill: 256 rows per expert
  if (amx) amx_grouped_rows();
  // bf16 experts where the AVX-512 BF16 dot kernel runs: as columns (converted per product) and
  // as switchyard lays them out there (pairs, read in place), side by side. Each set is allocated
  // after the one before it is freed: on a fragmented VM the second may get fewer huge pages,
  // which the memory-bound rows (one row an expert) show and the others hardly.
  if (!amx && kernels::GlobalKernelOptions().bf16_dot && kernels::HasBf16Dot()) {
    const bool dot_pairs = GlobalBf16DotPairs();
    for (bool pairs : {false, true}) {
      GlobalBf16DotPairs() = pairs;
      BenchGrouped(peaks, options, groups, rows, out, DType::kBF16);
    }
    GlobalBf16DotPairs() = dot_pairs;
  }
  for (const auto& shape : ggml_shapes)
    BenchLinear(peaks, options, shape, ggml_m, out);

  if (options.onednn) {
    // The batched-decode and prefill row counts, where a GEMM library competes.
    std::vector<int64_t> onednn_m;
    for (int64_t m : decode_m)
      if (m >= 8) onednn_m.push_back(m);
    for (int64_t m : prefill_m)
      onednn_m.push_back(m);
    if (GlobalWeightPacking() == WeightPacking::kExact)  // int8 packing has no oneDNN form
      BenchLinear(peaks, options, shapes[0], prefill_m, out, /*onednn_blocks=*/true);
    BenchOnednn(peaks, options, shapes[0], onednn_m, out);
    // The other shapes: the largest decode batch quick; in full, batched decode at 32 and 128
    // rows and every prefill row count (each m streams its own copies of the weights in f32 or
    // bf16, so every m on the dense MLP's shape would take many minutes).
    std::vector<int64_t> other_m = {decode_m.back()};
    if (!options.quick) {
      other_m = {32, 128};
      other_m.insert(other_m.end(), prefill_m.begin(), prefill_m.end());
    }
    for (size_t i = 1; i < shapes.size(); ++i)
      BenchOnednn(peaks, options, shapes[i], other_m, out);
  }

  for (int64_t q : {1, 2}) {
    for (int64_t batch : options.quick ? std::vector<int64_t>{4} : std::vector<int64_t>{1, 4, 16}) {
      for (DType cache_dtype : {DType::kBF16, DType::kF8E4M3})
        BenchMlaDecode(peaks, options, batch, 5000, q, cache_dtype, out);
    }
  }
  // Prompt chunks: a fresh prompt, and a short suffix after a cached prefix (a chat's next turn).
  const std::vector<std::pair<int64_t, int64_t>> prefill_chunks =
      options.quick ? std::vector<std::pair<int64_t, int64_t>>{{0, 512}, {1024, 32}}
                    : std::vector<std::pair<int64_t, int64_t>>{
                          {0, 512}, {0, 2048}, {1024, 32}, {4096, 32}, {4096, 256}};
  for (auto [prefix, tokens] : prefill_chunks)
    BenchMlaPrefill(peaks, options, prefix, tokens, out);
  for (int64_t kv_len : dsa_kv)
    BenchDsaDecode(peaks, options, 4, kv_len, out);
  for (int64_t kv_len : dsa_prefill_kv)
    BenchDsaDecode(peaks, options, 1, kv_len, out, 512);
  return out;
}

std::string KernelResultsJson(const MachinePeaks& peaks, const std::vector<KernelResult>& results) {
  nlohmann::json j;
  j["machine"] = {{"read_gbps", peaks.read_gbps},
                  {"triad_gbps", peaks.triad_gbps},
                  {"bf16_gflops", peaks.bf16_gflops},
                  {"f32_gflops", peaks.f32_gflops},
                  {"int8_gops", peaks.int8_gops},
                  {"amx_bf16_gflops", peaks.amx_bf16_gflops},
                  {"amx_int8_gops", peaks.amx_int8_gops},
                  {"threads", peaks.threads},
                  {"llc_bytes", peaks.llc_bytes},
                  {"stream_bytes", peaks.stream_bytes},
                  {"max_isa", kernels::IsaLevelName(kernels::MaxIsaLevel())},
                  {"amx", kernels::Amx().detail}};
  j["results"] = nlohmann::json::array();
  for (const auto& r : results) {
    j["results"].push_back({{"kernel", r.kernel},
                            {"weight_dtype", r.weight_dtype},
                            {"path", r.path},
                            {"m", r.m},
                            {"n", r.n},
                            {"k", r.k},
                            {"groups", r.groups},
                            {"seconds", r.seconds},
                            {"gbps", r.gbps},
                            {"gflops", r.gflops},
                            {"roofline_fraction", r.roofline_fraction},
                            {"vs_onednn", r.vs_onednn},
                            {"implementation", r.implementation}});
  }
  return j.dump(1) + "\n";
}

std::string KernelResultsTable(const MachinePeaks& peaks,
                               const std::vector<KernelResult>& results) {
  std::string out = fmt::format(
      "machine: read {:.1f} GB/s, triad {:.1f} GB/s, bf16 {:.1f} GFLOP/s, f32 {:.1f} GFLOP/s, "
      "int8 {:.1f} GOP/s, AMX bf16 {:.1f} GFLOP/s, AMX int8 {:.1f} GOP/s, {} threads; "
      "last-level cache {} MiB, {} MiB streamed per array; --max-isa {}; AMX: {}\n\n",
      peaks.read_gbps, peaks.triad_gbps, peaks.bf16_gflops, peaks.f32_gflops, peaks.int8_gops,
      peaks.amx_bf16_gflops, peaks.amx_int8_gops, peaks.threads, peaks.llc_bytes >> 20,
      peaks.stream_bytes >> 20, kernels::IsaLevelName(kernels::MaxIsaLevel()),
      kernels::Amx().detail);
  out += fmt::format(
      "{:<13} {:<5} {:<28} {:>6} {:>6} {:>6} {:>6} {:>10} {:>8} {:>9} {:>9} {:>10}\n", "kernel",
      "dtype", "path", "m", "n", "k", "groups", "µs", "GB/s", "GFLOP/s", "roofline", "vs onednn");
  for (const auto& r : results) {
    out += fmt::format(
        "{:<13} {:<5} {:<28} {:>6} {:>6} {:>6} {:>6} {:>10.1f} {:>8.2f} {:>9.2f} {:>8.0f}% "
        "{:>10}\n",
        r.kernel, r.weight_dtype, r.path, r.m, r.n, r.k, r.groups, r.seconds * 1e6, r.gbps,
        r.gflops, r.roofline_fraction * 100,
        r.vs_onednn > 0 ? fmt::format("{:.2f}x", r.vs_onednn) : std::string());
  }
  for (const auto& r : results)
    if (!r.implementation.empty()) {
      out += fmt::format("oneDNN's implementation: {}\n", r.implementation);
      break;
    }
  return out;
}

}  // namespace sy::bench
