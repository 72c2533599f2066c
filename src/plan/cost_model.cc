#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/latent_row.h"

namespace sy::plan {
namespace {

constexpr double kGB = 1e9;
constexpr double kBf16 = 2, kFp8 = 1;

// fp8 block scales: one f32 per 128×128 block.
double Fp8Bytes(double rows, double cols) {
  return rows * cols + std::ceil(rows / 128) * std::ceil(cols / 128) * 4;
}

}  // namespace

const char* OverlapName(Overlap overlap) {
  switch (overlap) {
    case Overlap::kNone:
      return "none";
    case Overlap::kDispatch:
      return "dispatch";
    case Overlap::kMicrobatch:
      return "microbatch";
  }
  return "?";
}

CostModel::CostModel(const ModelConfig& model, const HardwareSpec& hardware,
                     const Workload& workload)
    : m_(model), hw_(hardware), work_(workload) {}

// A DSA model (DeepSeek-V3.2) caches the indexer's key beside each latent row, as switchyard
// lays its rows out (ModelConfig::cache_row_width).
int64_t CostModel::KvBytesPerToken() const {
  return KvRowBytes() * m_.num_hidden_layers;
}

int64_t CostModel::KvRowBytes(bool index_keys) const {
  const int64_t width = index_keys ? m_.cache_row_width() : m_.latent_cache_width();
  return kernels::LatentRowLayout::Of(work_.kv_dtype, width, m_.kv_lora_rank).row_bytes;
}

MemoryEstimate CostModel::Memory(const Deployment& d) const {
  const double D = m_.hidden_size, H = m_.num_attention_heads, T = d.tp;
  const double rq = m_.q_lora_rank.value_or(0), dqk = m_.qk_head_dim();
  const int64_t mtp_layers =
      work_.mtp > 0
          ? std::min<int64_t>(work_.mtp, std::max<int64_t>(m_.num_nextn_predict_layers, 1))
          : 0;
  int64_t moe_layers = mtp_layers, dense_layers = 0;
  for (int64_t l = 0; l < m_.num_hidden_layers; ++l)
    (m_.IsMoeLayer(l) ? moe_layers : dense_layers)++;
  const int64_t attention_layers = m_.num_hidden_layers + mtp_layers;

  MemoryEstimate mem;
  const double expert =
      2 * Fp8Bytes(m_.moe_intermediate_size, D) + Fp8Bytes(D, m_.moe_intermediate_size);
  mem.routed_expert_bytes =
      moe_layers * (static_cast<double>(m_.n_routed_experts + d.redundant_experts) / d.ep) * expert;
  // kv_a, kv_b (and q_a) serve every head, so TP replicates them; q_b and o_proj split by heads.
  double replicated = Fp8Bytes(m_.latent_cache_width(), D) +
                      Fp8Bytes(H * (m_.qk_nope_head_dim + m_.v_head_dim), m_.kv_lora_rank) +
                      (m_.q_lora_rank ? Fp8Bytes(rq, D) : 0);
  // DSA's indexer serves every head too: wq_b and wk in fp8, weights_proj in bf16.
  if (m_.has_indexer())
    replicated += Fp8Bytes(m_.index_n_heads * m_.index_head_dim, rq) +
                  Fp8Bytes(m_.index_head_dim, D) + m_.index_n_heads * D * kBf16;
  double split = (m_.q_lora_rank ? Fp8Bytes(H * dqk, rq) : Fp8Bytes(H * dqk, D)) +
                 Fp8Bytes(D, H * m_.v_head_dim);
  mem.attention_bytes = attention_layers * (replicated + split / T);
  mem.dense_bytes =
      dense_layers * (2 * Fp8Bytes(m_.intermediate_size, D) + Fp8Bytes(D, m_.intermediate_size));
  const double shared = m_.shared_expert_width();
  mem.shared_expert_bytes = moe_layers * (2 * Fp8Bytes(shared, D) + Fp8Bytes(D, shared));
  mem.other_weight_bytes = 2 * m_.vocab_size * D * kBf16 +                       // embeddings, head
                           moe_layers * m_.n_routed_experts * (D * kBf16 + 4) +  // routers
                           attention_layers * 4 * D * kBf16 +                    // norms
                           mtp_layers * 2 * D * D * kBf16;                       // eh_proj
  mem.weight_bytes = mem.routed_expert_bytes + mem.attention_bytes + mem.dense_bytes +
                     mem.shared_expert_bytes + mem.other_weight_bytes;

  const double q = 1 + work_.mtp;
  const double group_tokens = d.batch * q;
  // Hidden states, q/latent buffers, dispatch (fp8) and combine (bf16) buffers, plus a fixed
  // workspace for GEMM and attention scratch.
  mem.activation_bytes = group_tokens * (4 * D * kBf16 + H / T * (dqk + m_.kv_lora_rank) * kBf16) +
                         group_tokens / T * m_.num_experts_per_tok * D * (kFp8 + kBf16) + 0.5 * kGB;
  mem.kv_bytes_per_request =
      static_cast<double>(work_.kv_len) * static_cast<double>(KvRowBytes()) * attention_layers;
  mem.free_bytes = hw_.memory_capacity_gb * kGB - hw_.memory_reserved_gb * kGB - mem.weight_bytes -
                   mem.activation_bytes;
  mem.max_requests =
      mem.free_bytes > 0 ? static_cast<int64_t>(mem.free_bytes / mem.kv_bytes_per_request) : 0;
  mem.fits = mem.max_requests >= d.batch;
  return mem;
}

double CostModel::GemmUs(double m, double k, double n, double weight_bytes, bool fp8) const {
  const Efficiency& e = hw_.efficiency;
  if (m <= 0) return 0;
  const double flops = 2 * m * k * n;
  const double bytes = n * k * weight_bytes + (m * k + m * n) * kBf16;
  const double peak = (fp8 ? hw_.fp8_tflops() : hw_.peak_bf16_tflops) * 1e12;
  const double compute_eff = e.gemm_compute * m / (m + e.gemm_m_half);
  const double compute_us = flops / (peak * compute_eff) * 1e6;
  const double memory_us = bytes / (hw_.memory_bandwidth_gbps * kGB * e.gemm_memory) * 1e6;
  return std::max({compute_us, memory_us, e.kernel_floor_us});
}

// One all-to-all phase moving `bytes` out of each device, spread evenly over the other EP−1
// devices: the intra-node share over NVLink, the rest over the inter-node NIC, concurrently.
double CostModel::LinkUs(double bytes, int ep) const {
  if (ep <= 1 || bytes <= 0) return 0;
  const Efficiency& e = hw_.efficiency;
  const int local = std::min(ep, hw_.devices_per_node);
  const double intra_share = static_cast<double>(local - 1) / ep;
  const double inter_share = static_cast<double>(ep - local) / ep;
  double us = bytes * intra_share / (hw_.intra_node.bandwidth_gbps * kGB * e.link) * 1e6;
  double latency = hw_.intra_node.latency_us;
  if (inter_share > 0) {
    us = std::max(us, bytes * inter_share / (hw_.inter_node.bandwidth_gbps * kGB * e.link) * 1e6);
    latency = hw_.inter_node.latency_us;
  }
  return std::max(us + latency, e.kernel_floor_us);
}

struct CostModel::Parts {
  double attention = 0, projections = 0, tp_reduce = 0, router = 0, shared = 0, dense = 0;
  double grouped = 0, dispatch = 0, combine = 0, other = 0;
  double active_experts = 0, tokens_per_expert = 0;
  double AttentionStage() const { return attention + projections + tp_reduce + router + other; }
};

CostModel::Parts CostModel::LayerParts(const Deployment& d, double group_tokens, bool moe) const {
  const Efficiency& e = hw_.efficiency;
  const double D = m_.hidden_size, T = d.tp, H = m_.num_attention_heads / T;
  const double dqk = m_.qk_head_dim(), latent = m_.kv_lora_rank, row = m_.latent_cache_width();
  const double q_len = 1 + work_.mtp;
  const double requests = group_tokens / q_len;
  Parts p;
  // Projections of the DP group's tokens (q_a and kv_a replicated across TP, heads split).
  if (m_.q_lora_rank) {
    const double rq = *m_.q_lora_rank;
    p.projections += GemmUs(group_tokens, D, rq + row, kFp8, true);  // fused qkv_a_proj (seed)
    p.projections += GemmUs(group_tokens, rq, H * dqk, kFp8, true);
  } else {
    p.projections +=
        GemmUs(group_tokens, D, row, kFp8, true) + GemmUs(group_tokens, D, H * dqk, kFp8, true);
  }
  // Absorbed MLA: q·W_UK and o_lat·W_UV as fp8 batched GEMMs over the local heads.
  p.projections += GemmUs(group_tokens, m_.qk_nope_head_dim, H * latent, kFp8, true);
  p.projections += GemmUs(group_tokens, latent, H * m_.v_head_dim, kFp8, true);
  p.projections += GemmUs(group_tokens, H * m_.v_head_dim, D, kFp8, true);  // o_proj
  // MLA decode over the latent cache: each request's cache is read once for all local heads.
  // Under DSA each query attends to index_topk keys at most, and the indexer (replicated over
  // TP, every rank choosing the same keys) scores all of them first: its projections, then its
  // heads against every cached key, read once per request.
  const double kv = static_cast<double>(work_.kv_len);
  const double attended = m_.has_indexer() ? std::min(kv, static_cast<double>(m_.index_topk)) : kv;
  {
    const double flops = 2 * group_tokens * H * attended * (row + latent);
    const double row_bytes = static_cast<double>(KvRowBytes(/*index_keys=*/false));
    const double bytes =
        group_tokens * attended * row_bytes + group_tokens * H * (row + latent) * kBf16;
    // Dense: a request's queries share one read of its cache; DSA: each query reads its own keys.
    const double read = m_.has_indexer()
                            ? bytes
                            : requests * kv * row_bytes + group_tokens * H * (row + latent) * kBf16;
    p.attention = std::max({flops / (hw_.peak_bf16_tflops * 1e12 * e.attention_compute) * 1e6,
                            read / (hw_.memory_bandwidth_gbps * kGB * e.attention_memory) * 1e6,
                            e.kernel_floor_us});
  }
  if (m_.has_indexer() && m_.q_lora_rank) {
    const double Hi = m_.index_n_heads, dI = m_.index_head_dim;
    p.projections += GemmUs(group_tokens, *m_.q_lora_rank, Hi * dI, kFp8, true) +
                     GemmUs(group_tokens, D, dI + Hi, kFp8, true);
    const double flops = 2 * group_tokens * Hi * dI * kv;
    const double bytes = requests * kv * dI * kBf16;
    p.attention += std::max({flops / (hw_.peak_bf16_tflops * 1e12 * e.attention_compute) * 1e6,
                             bytes / (hw_.memory_bandwidth_gbps * kGB * e.attention_memory) * 1e6,
                             e.kernel_floor_us});
  }
  if (d.tp > 1) {  // reduce-scatter of o_proj's output inside the node
    const double bytes = group_tokens * D * kBf16 * (T - 1) / T;
    p.tp_reduce =
        bytes / (hw_.intra_node.bandwidth_gbps * kGB * e.link) * 1e6 + hw_.intra_node.latency_us;
  }
  p.other = e.layer_overhead_us;
  const double tokens = group_tokens / T;  // this device's share after attention
  if (!moe) {
    p.dense = GemmUs(tokens, D, 2.0 * m_.intermediate_size, kFp8, true) +
              GemmUs(tokens, m_.intermediate_size, D, kFp8, true);
    return p;
  }
  const double E = m_.n_routed_experts, K = m_.num_experts_per_tok;
  p.router = GemmUs(tokens, D, E, kBf16, false);
  const double shared = m_.shared_expert_width();
  if (shared > 0)
    p.shared = GemmUs(tokens, D, 2 * shared, kFp8, true) + GemmUs(tokens, shared, D, kFp8, true);

  // Routed experts. Each token picks K distinct experts of E, so an expert is untouched by all
  // of the step's global tokens with probability (1 − K/E)^tokens (balanced routing).
  // Skew: the busiest device holds (E + R) / EP experts and receives imbalance × the mean rows;
  // the layer ends when it does.
  const double global_tokens = tokens * d.ep;
  const double local_experts = (E + static_cast<double>(d.redundant_experts)) / d.ep;
  p.active_experts = local_experts * (1 - std::pow(1 - K / E, global_tokens));
  const double slots = tokens * K * std::max(1.0, d.expert_imbalance);  // the busiest device's
  p.tokens_per_expert = p.active_experts > 0 ? slots / p.active_experts : 0;
  {
    const double Im = m_.moe_intermediate_size;
    const double flops = 2 * slots * 3 * D * Im;
    const double weights = p.active_experts * (2 * Fp8Bytes(Im, D) + Fp8Bytes(D, Im));
    const double activations = slots * (D * kFp8 + 2 * Im * kBf16 + Im * kFp8 + D * kBf16);
    const double m = p.tokens_per_expert;
    const double compute_eff = e.grouped_compute * m / (m + e.grouped_m_half);
    p.grouped = std::max(
        {flops / (hw_.fp8_tflops() * 1e12 * compute_eff) * 1e6,
         (weights + activations) / (hw_.memory_bandwidth_gbps * kGB * e.grouped_memory) * 1e6,
         e.kernel_floor_us});
  }
  // Dispatch sends fp8 rows with 1×128 scales; combine returns bf16 rows.
  p.dispatch = LinkUs(slots * (D * kFp8 + D / 128 * 4), d.ep);
  p.combine = LinkUs(slots * D * kBf16, d.ep);
  return p;
}

Prediction CostModel::Predict(const Deployment& d) const {
  Prediction out;
  out.deployment = d;
  out.memory = Memory(d);
  const double q_len = 1 + work_.mtp;
  const double group_tokens = d.batch * q_len;

  Parts whole = LayerParts(d, group_tokens, true);
  out.experts_active_per_gpu = whole.active_experts;
  out.tokens_per_expert = whole.tokens_per_expert;
  LayerBreakdown& layer = out.moe_layer;
  if (d.overlap == Overlap::kMicrobatch) {
    // Two half-batches offset by three stages (seed §Micro-batching): a half's dispatch runs
    // under the other half's attention and shared expert, or under its grouped GEMM; a half's
    // combine under the other's grouped GEMM, or under the next layer's attention.
    Parts half = LayerParts(d, group_tokens / 2, true);
    layer.attention = 2 * half.attention;
    layer.gemm = 2 * (half.projections + half.router + half.shared);
    layer.tp_reduce = 2 * half.tp_reduce;
    layer.grouped_gemm = 2 * half.grouped;
    layer.other = 2 * half.other;
    layer.dispatch = std::max(0.0, half.dispatch - (half.AttentionStage() + half.shared)) +
                     std::max(0.0, half.dispatch - half.grouped);
    layer.combine = std::max(0.0, half.combine - half.grouped) +
                    std::max(0.0, half.combine - half.AttentionStage());
  } else {
    layer.attention = whole.attention;
    layer.gemm = whole.projections + whole.router + whole.shared;
    layer.tp_reduce = whole.tp_reduce;
    layer.grouped_gemm = whole.grouped;
    layer.other = whole.other;
    // Dispatch overlap: the shared expert runs between dispatch send and receive.
    layer.dispatch = d.overlap == Overlap::kDispatch ? std::max(0.0, whole.dispatch - whole.shared)
                                                     : whole.dispatch;
    layer.combine = whole.combine;
  }
  layer.total = layer.attention + layer.gemm + layer.tp_reduce + layer.grouped_gemm +
                layer.dispatch + layer.combine + layer.other;

  Parts dense = LayerParts(d, group_tokens, false);  // dense-first layers always run whole
  out.dense_layer.attention = dense.attention;
  out.dense_layer.gemm = dense.projections + dense.dense;
  out.dense_layer.tp_reduce = dense.tp_reduce;
  out.dense_layer.other = dense.other;
  out.dense_layer.total = dense.AttentionStage() + dense.dense;

  out.head_us =
      GemmUs(group_tokens / d.tp, m_.hidden_size, static_cast<double>(m_.vocab_size), kBf16, false);
  int64_t moe_layers = 0, dense_layers = 0;
  for (int64_t l = 0; l < m_.num_hidden_layers; ++l)
    (m_.IsMoeLayer(l) ? moe_layers : dense_layers)++;
  out.step_us = dense_layers * out.dense_layer.total + moe_layers * layer.total + out.head_us;
  if (work_.mtp > 0) {  // the MTP module: one more MoE block, its projection and head
    out.step_us += work_.mtp * (layer.total + out.head_us +
                                GemmUs(group_tokens / d.tp, 2.0 * m_.hidden_size, m_.hidden_size,
                                       kBf16, false));
  }
  out.output_tok_s = (1 + work_.acceptance * work_.mtp) / (out.step_us * 1e-6);
  out.throughput_tok_s_per_gpu = d.batch * out.output_tok_s / d.tp;
  return out;
}

}  // namespace sy::plan
