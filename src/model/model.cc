#include "model/model.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include <malloc.h>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "model/expert_placement.h"
#include "model/feed_forward.h"
#include "model/gguf_model.h"
#include "model/load_progress.h"
#include "tensor/packed_matrix.h"

namespace sy {
namespace {

// "N tensors, X.Y GB" of a checkpoint, for the progress lines.
std::string CheckpointSize(const Checkpoint& checkpoint) {
  uint64_t bytes = 0;
  for (const auto& [name, tensor] : checkpoint.tensors())
    bytes += tensor.entry->data_end - tensor.entry->data_begin;
  return fmt::format("{} tensors, {:.1f} MB", checkpoint.tensors().size(), bytes / 1e6);
}

}  // namespace

Result<std::unique_ptr<Model>> Model::Load(const std::string& directory,
                                           const WeightLoadOptions& options) {
  auto model = std::unique_ptr<Model>(new Model());
  model->directory_ = directory;
  LoadProgress progress(directory);
  if (IsGgufFile(directory)) {
    // A llama.cpp GGUF: config from its metadata; quantized weights kept as their blocks (read
    // in place from the mapping, packed for the GGML kernels below), the rest decoded to f32.
    SY_ASSIGN_OR_RETURN(GgufShards gguf, GgufShards::Open(directory));
    SY_ASSIGN_OR_RETURN(model->config_, GgufModelConfig(gguf));
    size_t tensors = 0;
    for (const GgufFile& file : gguf.files())
      tensors += file.tensors().size();
    progress.Stage(fmt::format("GGUF v{} mapped ({} file{}), {} tensors, config read",
                               gguf.first().version(), gguf.files().size(),
                               gguf.files().size() == 1 ? "" : "s", tensors));
    // Only the experts this process holds are decoded (LoadWeights reads no others).
    std::map<int64_t, std::vector<int32_t>> held;  // by layer, under a placement
    const int64_t end =
        options.expert_end < 0 ? model->config_.n_routed_experts : options.expert_end;
    auto keep_expert = [&](int64_t layer, int64_t expert) {
      if (options.placement == nullptr) return expert >= options.expert_begin && expert < end;
      const std::vector<int32_t>* slots = options.placement->Layer(layer);
      if (slots == nullptr) return true;  // LoadWeights names the missing layer
      auto [it, fresh] = held.try_emplace(layer);
      if (fresh)
        it->second = HeldExperts(*slots, options.placement->slots_per_rank, options.placement_rank);
      return std::find(it->second.begin(), it->second.end(), expert) != it->second.end();
    };
    SY_ASSIGN_OR_RETURN(Checkpoint checkpoint, GgufCheckpoint(gguf, model->config_, keep_expert));
    model->checkpoint_ = std::make_unique<Checkpoint>(std::move(checkpoint));
    progress.Stage(fmt::format("{}, {}",
                               GlobalGgufWeights() == GgufWeights::kNative
                                   ? "quantized blocks kept, the rest decoded"
                                   : "dequantized into memory",
                               CheckpointSize(*model->checkpoint_)));
  } else {
    SY_ASSIGN_OR_RETURN(
        model->config_,
        LoadModelConfig((std::filesystem::path(directory) / "config.json").string()));
    SY_RETURN_IF_ERROR(ReadGenerationConfig(directory, &model->config_));
    SY_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(directory));
    std::string set_aside;
    if (!model->config_.wrapper_type.empty()) {
      SY_RETURN_IF_ERROR(checkpoint.UseLanguageModel(model->config_.checkpoint_prefix,
                                                     model->config_.checkpoint_set_aside));
      set_aside = fmt::format("; {}'s language model alone ({} vision tensors not read: text only)",
                              model->config_.wrapper_type, checkpoint.set_aside_count());
    }
    model->checkpoint_ = std::make_unique<Checkpoint>(std::move(checkpoint));
    progress.Stage(fmt::format("config read, checkpoint mapped, {}{}",
                               CheckpointSize(*model->checkpoint_), set_aside));
  }
  SY_ASSIGN_OR_RETURN(model->weights_, LoadWeights(*model->checkpoint_, model->config_, options,
                                                   &model->unused_tensors_));
  progress.Stage(fmt::format("{} layers' weights checked", model->weights_.layers.size()));
  model->packed_ = options.pack;
  if (options.pack) {
    PanelArenaScope arena;  // the small matrices side by side in huge pages
    PackWeights(model->config_, model->weights_);
    progress.Stage("weights packed for the kernels");
  }
  model->attention_config_ = model->config_;
  if (options.tp_size > 1) {
    if (model->config_.num_attention_heads % options.tp_size != 0)
      return Status::Errorf("{} attention heads cannot be split over {} tensor-parallel ranks",
                            model->config_.num_attention_heads, options.tp_size);
    const std::string decoded =
        ShardAttentionHeads(model->config_, options.tp_rank, options.tp_size,
                            options.sequence_parallel_attention, model->weights_);
    if (!decoded.empty() && options.tp_rank == 0) {
      std::fprintf(stderr, "switchyard: %s: %s\n", directory.c_str(), decoded.c_str());
      std::fflush(stderr);
    }
    model->sequence_parallel_attention_ = options.sequence_parallel_attention;
    model->attention_config_.num_attention_heads /= options.tp_size;
    model->attention_config_.num_key_value_heads = model->attention_config_.num_attention_heads;
  }
  model->rope_ = ComputeRopeParams(model->config_);
  for (const auto& layer : model->weights_.layers)
    model->layer_table_.push_back(&layer);
  for (const auto& mtp : model->weights_.mtp)
    model->layer_table_.push_back(&mtp.block);
  // Loading frees many buffers of a few MB (an int4 matrix's unpacked codes and blocks, decoded
  // rows): glibc raises its mmap threshold past them after the first and keeps the rest on its
  // heap, where the freed pages stayed resident (an AWQ bench model held 1.8x its file). Give them
  // back to the kernel once.
  malloc_trim(0);
  progress.Done();
  return model;
}

LatentCache Model::NewCache(int64_t max_tokens, int64_t max_sequences, DType dtype,
                            int64_t page_size, bool mtp) const {
  const int64_t pages = (max_tokens + page_size - 1) / page_size + max_sequences;
  return LatentCache(CacheLayers(mtp && has_mtp()), config_.cache_row_width(), page_size, pages,
                     dtype, config_.kv_lora_rank);
}

const MoeWeights* Model::MoeAt(int64_t layer) const {
  const int64_t main = static_cast<int64_t>(weights_.layers.size());
  const DecoderLayerWeights* block = nullptr;
  if (layer >= 0 && layer < main)
    block = &weights_.layers[static_cast<size_t>(layer)];
  else if (layer >= main && layer - main < static_cast<int64_t>(weights_.mtp.size()))
    block = &weights_.mtp[static_cast<size_t>(layer - main)].block;
  return block != nullptr && block->is_moe ? &block->moe : nullptr;
}

const FeedForwardWeights* Model::RoutedExpert(int64_t layer, int32_t expert) const {
  const MoeWeights* moe = MoeAt(layer);
  if (moe == nullptr || expert < 0 || expert >= static_cast<int32_t>(moe->experts.size()))
    return nullptr;
  const FeedForwardWeights& ff = moe->experts[static_cast<size_t>(expert)];
  return ff.empty() ? nullptr : &ff;
}

void Model::PackArrivedExpert(FeedForwardWeights& expert) const {
  if (packed_) PackRoutedExpert(expert);
}

Status Model::InstallRoutedExperts(int64_t layer, const std::vector<int32_t>& held,
                                   std::map<int32_t, FeedForwardWeights> arrived) {
  // The layer is only ever reached through MoeAt's const pointer elsewhere; this is the one
  // place that changes it, between steps.
  auto* moe = const_cast<MoeWeights*>(MoeAt(layer));
  if (moe == nullptr) return Status::Errorf("layer {} has no routed experts", layer);
  const int32_t experts = static_cast<int32_t>(moe->experts.size());
  std::vector<bool> keep(moe->experts.size(), false);
  for (int32_t e : held) {
    if (e < 0 || e >= experts) return Status::Errorf("layer {}: no expert {}", layer, e);
    keep[static_cast<size_t>(e)] = true;
    if (moe->experts[static_cast<size_t>(e)].empty() && arrived.count(e) == 0)
      return Status::Errorf("layer {}: expert {} is neither held nor arrived", layer, e);
  }
  for (auto& [e, ff] : arrived) {
    if (e < 0 || e >= experts || !keep[static_cast<size_t>(e)])
      return Status::Errorf("layer {}: expert {} arrived but is not to be held", layer, e);
  }
  for (auto& [e, ff] : arrived)
    moe->experts[static_cast<size_t>(e)] = std::move(ff);
  for (int32_t e = 0; e < experts; ++e)
    if (!keep[static_cast<size_t>(e)])
      moe->experts[static_cast<size_t>(e)] = FeedForwardWeights();  // frees its panels
  return Status::Ok();
}

Result<FeedForwardWeights> Model::LoadRoutedExpert(int64_t layer, int32_t expert) const {
  const MoeWeights* held = MoeAt(layer);
  if (held == nullptr) return Status::Errorf("layer {} has no routed experts", layer);
  MoeWeights moe;
  moe.experts.resize(held->experts.size());
  if (IsGgufFile(directory_)) {
    // The loaded checkpoint holds only this rank's experts: the file is mapped again (cheap) for
    // the one asked for.
    SY_ASSIGN_OR_RETURN(GgufShards gguf, GgufShards::Open(directory_));
    auto only_this = [&](int64_t l, int64_t e) { return l == layer && e == expert; };
    SY_ASSIGN_OR_RETURN(Checkpoint one, GgufCheckpoint(gguf, config_, only_this));
    SY_RETURN_IF_ERROR(LoadRoutedExperts(one, config_, layer, {expert}, packed_, moe));
    return std::move(moe.experts[static_cast<size_t>(expert)]);
  }
  SY_RETURN_IF_ERROR(LoadRoutedExperts(*checkpoint_, config_, layer, {expert}, packed_, moe));
  return std::move(moe.experts[static_cast<size_t>(expert)]);
}

Status Model::CheckBatch(const ForwardBatch& batch, bool mtp) const {
  int64_t expected_offset = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceSlice& seq = batch.sequences[s];
    if (seq.token_count <= 0) return Status::Errorf("sequence {} is empty", s);
    if (seq.cache == nullptr) return Status::Errorf("sequence {} has no cache", s);
    if (seq.token_offset != expected_offset || seq.token_offset + seq.token_count > batch.size())
      return Status::Errorf("sequence {}: tokens [{}, {}) do not follow the previous sequence", s,
                            seq.token_offset, seq.token_offset + seq.token_count);
    if (mtp ? (seq.start_position < 0 || seq.start_position > seq.cache->length)
            : seq.start_position != seq.cache->length)
      return Status::Errorf("sequence {}: starts at position {} but its cache holds {} tokens", s,
                            seq.start_position, seq.cache->length);
    for (int64_t i = 0; i < seq.token_count; ++i) {
      const int32_t id = batch.tokens[static_cast<size_t>(seq.token_offset + i)];
      if (id < 0 || id >= config_.vocab_size)
        return Status::Errorf("sequence {}, position {}: token id {} is outside [0, {})", s,
                              seq.start_position + i, id, config_.vocab_size);
    }
    expected_offset += seq.token_count;
  }
  if (expected_offset != batch.size())
    return Status::Errorf("batch has {} tokens but its sequences cover {}", batch.size(),
                          expected_offset);
  return Status::Ok();
}

namespace {

// A step whose sequences all have a decode step's few queries (absorbed MLA's range).
bool IsDecodeStep(const ForwardBatch& batch) {
  for (const auto& seq : batch.sequences)
    if (seq.token_count > kAbsorbedMaxQueries) return false;
  return true;
}

}  // namespace

Status Model::ReserveRows(const ForwardBatch& batch, LatentCache& cache) const {
  // Reserve cache rows for every sequence, or none.
  std::vector<int64_t> old_lengths;
  for (const auto& seq : batch.sequences) {
    old_lengths.push_back(seq.cache->length);
    Status reserved = cache.Reserve(*seq.cache, seq.start_position + seq.token_count);
    if (!reserved.ok()) {
      for (size_t i = 0; i < old_lengths.size(); ++i)
        cache.Truncate(*batch.sequences[i].cache, old_lengths[i]);
      return reserved;
    }
  }
  return Status::Ok();
}

template <typename RowInput>
Status Model::RunStack(const ForwardBatch& batch, LatentCache& cache, const ForwardOptions& options,
                       int64_t first, int64_t last, RowInput row_input,
                       std::vector<float>& hidden) const {
  const int64_t T = batch.size(), D = config_.hidden_size;
  AttentionGroup* group = options.attention_group;
  const bool sequence_parallel =
      group != nullptr && group->size() > 1 && options.attention_split == AttentionSplit::kSequence;
  if (sequence_parallel != sequence_parallel_attention_ && group != nullptr && group->size() > 1)
    return Status::Errorf("the weights are split for {} attention but the step asks for {}",
                          sequence_parallel_attention_ ? "SP-TP-SP" : "head-parallel",
                          sequence_parallel ? "SP-TP-SP" : "head-parallel");
  const int sp_size = sequence_parallel ? group->size() : 1;
  const int sp_rank = sequence_parallel ? group->rank() : 0;

  // The parts this rank holds: the whole batch (its SP shard under SP-TP-SP), or two
  // micro-batches. Without SP the micro-batches are views into the whole batch's rows, so the
  // dense-first layers run whole, as the seed's schedule has them.
  std::vector<MicroBatch> whole = SplitBatch(batch, 1, sp_size, sp_rank);
  std::vector<MicroBatch> halves;
  if (options.micro_batches) halves = SplitBatch(batch, 2, sp_size, sp_rank);
  hidden.clear();
  if (!sequence_parallel || halves.empty()) {
    hidden.resize(static_cast<size_t>(whole[0].rows * D));
    whole[0].hidden = hidden.data();
    if (!halves.empty()) {
      halves[0].hidden = hidden.data();
      halves[1].hidden = hidden.data() + halves[0].rows * D;
    }
  } else {
    hidden.resize(static_cast<size_t>((halves[0].rows + halves[1].rows) * D));
    halves[0].hidden = hidden.data();
    halves[1].hidden = hidden.data() + halves[0].rows * D;
  }
  std::vector<MicroBatch>& embedded = sequence_parallel && !halves.empty() ? halves : whole;
  for (const MicroBatch& mb : embedded)
    for (int64_t r = 0; r < mb.rows; ++r)
      row_input(mb.first_token + mb.row_begin + r, mb.hidden + r * D);

  const DecoderContext context{&config_, &attention_config_, &rope_, &layer_table_, &cache};
  if (halves.empty()) {
    RunDecoderLayers(context, options, whole, first, last);
  } else if (sequence_parallel) {
    RunDecoderLayers(context, options, halves, first, last);
  } else {
    int64_t first_moe = first;
    while (first_moe < last && !layer_table_[first_moe]->is_moe)
      ++first_moe;
    RunDecoderLayers(context, options, whole, first, first_moe);
    RunDecoderLayers(context, options, halves, first_moe, last);
  }
  if (sequence_parallel) {  // every rank of the group gets all the rows back, in token order
    std::vector<float> all(static_cast<size_t>(T * D));
    for (const MicroBatch& mb : embedded) {
      const int64_t size = mb.batch.size();
      std::vector<int64_t> counts(static_cast<size_t>(sp_size));
      for (int r = 0; r < sp_size; ++r)
        counts[r] = (size * (r + 1) / sp_size - size * r / sp_size) * D;
      group->AllGather(mb.hidden, counts, all.data() + mb.first_token * D);
    }
    hidden = std::move(all);
  }
  return Status::Ok();
}

void Model::Head(const ForwardBatch& batch, const ForwardOptions& options,
                 const std::vector<float>& hidden, const std::vector<float>& norm,
                 const Matrix& head, std::vector<float>* logits,
                 std::vector<float>* final_hidden) const {
  const ModelConfig& c = config_;
  const int64_t T = batch.size(), D = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<int64_t> rows;
  if (options.logit_rows == LogitRows::kAll) {
    for (int64_t t = 0; t < T; ++t)
      rows.push_back(t);
  } else {
    for (const auto& seq : batch.sequences) {
      if (seq.all_logit_rows)
        for (int64_t t = seq.token_offset; t < seq.token_offset + seq.token_count - 1; ++t)
          rows.push_back(t);
      rows.push_back(seq.token_offset + seq.token_count - 1);
    }
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<float> final_rows(static_cast<size_t>(R * D));
  if (final_hidden != nullptr) {
    final_hidden->resize(static_cast<size_t>(T * D));
    kernels::RmsNorm(hidden.data(), T, D, norm.data(), eps, final_hidden->data());
    for (int64_t r = 0; r < R; ++r)
      std::copy_n(final_hidden->data() + rows[r] * D, D, final_rows.data() + r * D);
  } else {
    for (int64_t r = 0; r < R; ++r)
      kernels::RmsNorm(hidden.data() + rows[r] * D, 1, D, norm.data(), eps,
                       final_rows.data() + r * D);
  }
  logits->resize(static_cast<size_t>(R * c.vocab_size));
  kernels::LinearAuto(final_rows.data(), R, head, logits->data());
}

Status Model::ForwardSequence(const std::vector<int32_t>& ids, const ForwardOptions& options,
                              std::vector<float>* logits, DType cache_dtype) const {
  LatentCache cache = NewCache(static_cast<int64_t>(ids.size()), 1, cache_dtype);
  SequenceCache sequence;
  ForwardBatch batch;
  batch.Add(ids.data(), static_cast<int64_t>(ids.size()), &sequence);
  return Forward(batch, cache, options, logits);
}

Status Model::Forward(const ForwardBatch& batch, LatentCache& cache, const ForwardOptions& options,
                      std::vector<float>* logits, std::vector<float>* final_hidden) const {
  SY_RETURN_IF_ERROR(CheckBatch(batch, /*mtp=*/false));
  SY_RETURN_IF_ERROR(ReserveRows(batch, cache));
  kernels::DecodeStepScope decode(IsDecodeStep(batch));
  std::vector<float> hidden;
  SY_RETURN_IF_ERROR(RunStack(
      batch, cache, options, 0, config_.num_hidden_layers,
      [&](int64_t t, float* row) {
        weights_.embed_tokens.DecodeRow(batch.tokens[static_cast<size_t>(t)], row);
      },
      hidden));
  Head(batch, options, hidden, weights_.norm, weights_.lm_head, logits, final_hidden);
  return Status::Ok();
}

Status Model::ForwardMtp(const ForwardBatch& batch, const float* main_hidden, LatentCache& cache,
                         const ForwardOptions& options, std::vector<float>* logits,
                         std::vector<float>* mtp_hidden) const {
  if (!has_mtp()) return Status::Error("the checkpoint has no MTP module");
  const int64_t L = config_.num_hidden_layers;
  if (cache.layers() <= L)
    return Status::Errorf("the latent cache has {} layers: none for the MTP block (layer {})",
                          cache.layers(), L);
  SY_RETURN_IF_ERROR(CheckBatch(batch, /*mtp=*/true));
  SY_RETURN_IF_ERROR(ReserveRows(batch, cache));
  kernels::DecodeStepScope decode(IsDecodeStep(batch));
  const MtpWeights& mtp = weights_.mtp[0];
  const int64_t T = batch.size(), D = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  // [enorm(embed(token)); hnorm(h)] for every row, then eh_proj in one product.
  std::vector<float> joined(static_cast<size_t>(T * 2 * D)), embedded(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    float* row = joined.data() + t * 2 * D;
    mtp.embed_tokens.DecodeRow(batch.tokens[static_cast<size_t>(t)], embedded.data());
    kernels::RmsNorm(embedded.data(), 1, D, mtp.enorm.data(), eps, row);
    kernels::RmsNorm(main_hidden + t * D, 1, D, mtp.hnorm.data(), eps, row + D);
  }
  std::vector<float> projected(static_cast<size_t>(T * D));
  if (T > 0) kernels::LinearAuto(joined.data(), T, mtp.eh_proj, projected.data());
  std::vector<float> hidden;
  SY_RETURN_IF_ERROR(RunStack(
      batch, cache, options, L, L + 1,
      [&](int64_t t, float* row) { std::copy_n(projected.data() + t * D, D, row); }, hidden));
  Head(batch, options, hidden, mtp.head_norm, mtp.head, logits, mtp_hidden);
  return Status::Ok();
}

}  // namespace sy
