// Shared test helpers: the committed Hugging Face fixtures and logit comparison.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampling.h"
#include "kernels/cpu/mla_decode.h"
#include "model/model.h"
#include "tensor/matrix.h"
#include "tokenizer/tokenizer.h"

namespace sy::testing {

inline const char* kFixturesDir = SY_FIXTURES_DIR;
inline const char* kBinary = SY_BINARY;

struct Fixture {
  std::string directory;
  std::string tokens_text;                   // CLI form
  std::vector<std::vector<int32_t>> tokens;  // per sequence
  std::vector<float> logits;                 // [rows, vocab]
  int64_t vocab = 0;
};

// `name` under tests/fixtures, or an absolute directory laid out the same way.
Fixture LoadFixture(const std::string& name);
std::vector<std::string> FixtureNames();

struct LogitComparison {
  double max_abs_diff = 0;
  double max_abs_reference = 0;
  int64_t argmax_checked = 0;        // rows whose reference top-2 margin exceeds the threshold
  int64_t argmax_mismatches = 0;     // of those, rows whose argmax differs
  std::vector<double> row_max_diff;  // per row
  // Rows whose max |Δ| exceeds `relative` × max|reference logit|.
  int64_t RowsOver(double relative) const;
};
LogitComparison CompareLogits(const std::vector<float>& reference, const std::vector<float>& got,
                              int64_t vocab, float margin = 0.05f);

// The bar of a path that rounds to bf16 (the cache, activations in the bf16 kernels or on AMX
// tiles) against a fixture's f32 reference: every confident row's argmax, and max |Δ| ≤ 1e-2 of
// the largest logit but in `budget` rows, where rounding flips a near-tie expert choice. For a
// DSA fixture (DeepSeek-V3.2), whose indexer's top-k choice rounding flips too, the rows before
// index_topk keep that bar and at least half of the sparse rows must meet it (test_support.cc).
void ExpectRoundedPathMeetsTheBar(const Model& model, const Fixture& fixture,
                                  const LogitComparison& comparison, int64_t budget,
                                  const std::string& what);

// A model and its tokenizer, loaded from one directory (failures are test failures).
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
LoadedModel LoadModelAndTokenizer(const std::string& directory);
// The engine tests' model: the small synthetic checkpoint with the default tokenizer, loaded once,
// with the kernels set so that a row's result does not depend on the batch (no bf16 GEMM for big
// batches or split-K for small ones, f32 activations in the products): a request served among
// others, chunked or from the prefix cache must give the tokens it gives alone, and the random
// model's routing would amplify any rounding difference into a flipped near-tie.
const LoadedModel& BatchInvariantSmallModel();
// A prompt of `length` ordinary token ids, different for each salt.
std::vector<int32_t> SaltedPrompt(int64_t length, int32_t salt);
// Greedy sampling of exactly `max_tokens` tokens (ignore_eos).
SamplingParams Greedy(int64_t max_tokens);

// A fresh empty directory under the test temp area.
std::string TempDirectory(const std::string& name);
// Recursively copies a directory.
void CopyDirectory(const std::string& from, const std::string& to);
std::string ReadFile(const std::string& path);
// A JSON Lines file, one value per non-empty line.
std::vector<nlohmann::json> ReadJsonLines(const std::string& path);
void WriteFile(const std::string& path, const std::string& contents);
// `from`'s safetensors checkpoint written to `to`/model.safetensors as a multimodal wrapper
// ships it (Kimi K2.5): every tensor under `prefix`, then stand-in vision tensors.
void WritePrefixedCheckpoint(const std::string& from, const std::string& to,
                             const std::string& prefix);

// Runs a shell command; returns its exit status and captures stdout+stderr.
int RunCommand(const std::string& command, std::string* output);

// The start of a command line that runs `ranks` MPI processes on this host: as root (CI
// containers), oversubscribed (four ranks on two cores), ended after `timeout_seconds`.
std::string Mpirun(int ranks, int timeout_seconds = 300);
// A file of f32 values (logits the CLI wrote with --out).
std::vector<float> ReadLogits(const std::string& path);

// Absorbed MLA attention computed directly in double, the reference of the flash-decoding
// kernels: o[t][h][d] = Σ_{j ≤ positions[t]} softmax_j(scale · (q_latent·row_j[:latent] +
// q_pe·row_j[latent:])) · row_j[d], rows [keys][latent + rope].
std::vector<double> AbsorbedAttentionReference(const std::vector<float>& q_latent,
                                               const std::vector<float>& q_pe,
                                               const std::vector<float>& rows,
                                               const std::vector<int64_t>& positions, int64_t heads,
                                               int64_t latent, int64_t rope, double scale);

// A paged latent cache of `keys` random rows of `width` (pages of `page` rows, laid out in the
// pool in reverse order), and the rows as f32 (the values the cache holds). An fp8 cache
// quantizes the first `latent` columns (kernels/cpu/latent_row.h).
struct TestLatentCache {
  std::vector<float> rows;
  std::vector<uint8_t> pool;
  std::vector<int32_t> table;
  kernels::LatentPages view;
};
TestLatentCache MakeTestLatentCache(int64_t keys, int64_t width, int64_t page, uint32_t seed,
                                    DType dtype = DType::kBF16, int64_t latent = 0);
// The same from given rows (`rows` is replaced by the values the cache holds).
TestLatentCache MakeTestLatentCacheOf(std::vector<float> rows, int64_t width, int64_t page,
                                      DType dtype, int64_t latent);

// Weights for the bf16 product kernels (bf16 dot, AMX): an fp8 matrix (scale blocks of
// block × block, scales 0.002 · (1 + i mod 7)) or a bf16 one, owning its bytes.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  Matrix view;
};
TestMatrix MakeTestMatrix(DType dtype, int64_t rows, int64_t cols, int64_t block,
                          const std::function<float(int64_t, int64_t)>& value);
// 16 rows × cols of fp8 holding byte (16·c + r) mod 256 at row r, column c — every byte once in
// each 16 columns, NaNs replaced by zero — in one scale block of scale 1.
TestMatrix EveryFp8ByteMatrix(int64_t cols);
// Normal values (× 60 for fp8, whose codes reach 448).
TestMatrix RandomTestMatrix(DType dtype, int64_t rows, int64_t cols, uint32_t seed, int64_t block);
// m × cols normal values.
std::vector<float> RandomRows(int64_t m, int64_t cols, uint32_t seed);
// y = x · wᵀ in double over the bf16 kernels' operands: x rounded to bf16, w exact (fp8 times its
// block scale). With `magnitudes`, also Σ_c |bf16(x) · w| per output, for error bounds.
std::vector<double> Bf16ProductReference(const TestMatrix& w, const std::vector<float>& x,
                                         int64_t m, std::vector<double>* magnitudes = nullptr);

}  // namespace sy::testing
