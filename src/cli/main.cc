// switchyard: one binary, a few verbs (docs/architecture.md).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "base/allocator.h"
#include "base/thread_pool.h"
#include "cli/verbs.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/onednn_linear.h"
#include "model/gguf_model.h"
#include "tensor/packed_matrix.h"

int main(int argc, char** argv) {
  sy::KeepFreedMemoryInHeap();
  CLI::App app{
      "switchyard: a wide-expert-parallel inference engine for DeepSeek-V3-class MoE models"};
  app.require_subcommand(1);
  app.fallthrough();  // the global options (--threads, --f32-products) also after the verb
  int threads = 0;
  // The pool's workers spin briefly between tasks: more workers than cores only makes them
  // wait on each other, so more than the machine has is refused rather than left to crawl.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int usable = sy::UsableCores();  // reads the affinity mask and cgroup files: once
  app.add_option("--threads", threads,
                 fmt::format("Worker threads (0: one per core this process may use, {} here; at "
                             "most {}, the machine's cores)",
                             usable, cores))
      ->check(CLI::Range(0, cores));
  bool f32_products = false;
  app.add_flag("--f32-products", f32_products,
               "Keep activations in f32 in every product, as the reference does (slower); by "
               "default fp8 and bf16 weights take the bf16 dot-product kernel where the CPU has "
               "AVX-512 BF16");
  bool int8_products = false;
  app.add_flag("--int8-products", int8_products,
               "Re-quantize fp8 and bf16 weights to int8 at load (7-bit codes, one scale per row "
               "and 128 columns; the router stays exact) and multiply them by activations "
               "quantized per row to 8 bits: about twice the f32 rate on CPUs without AVX-512 "
               "BF16, lossy (docs/benchmarks.md gives its accuracy); batch-invariant");
  bool amx_bf16_all = false, amx_bf16_none = false;  // neither: on the CPU's tiles, if any
  auto* amx_all =
      app.add_flag(
             "--amx-bf16", amx_bf16_all,
             "fp8 and bf16 weights, and absorbed MLA attention on a bf16 cache, take AMX's bf16 "
             "tiles (TDPBF16PS) at every batch size instead of the bf16 dot-product kernels "
             "(bf16 weights laid out as the tiles at load; fp8 converted a block at a time); "
             "batch-invariant. The default where the CPU has Intel AMX; this flag also runs it "
             "on the emulator (SWITCHYARD_AMX_EMULATE). On a Xeon with AMX the tiles made a bf16 "
             "checkpoint's prompts 2.5-4.5x and 32-sequence decode 1.9x faster, and an fp8 "
             "checkpoint's 32 x 64 prompts 5.6x and 32-sequence decode 1.9x faster, but its "
             "one-sequence decode 0.68x the dot kernel's (docs/benchmarks.md). --no-amx-bf16: "
             "none. (int8 products take AMX tiles from 16 rows wherever the CPU has them: the "
             "same bits as the vector kernels; GGUF and HF int4 ones only with "
             "SWITCHYARD_AMX_GGML=1, slower where measured.)")
          ->envname("SWITCHYARD_AMX_BF16");
  app.add_flag("--no-amx-bf16", amx_bf16_none,
               "No products or attention on AMX's bf16 tiles (see --amx-bf16): the AVX-512 BF16 "
               "dot kernels, faster for one fp8 sequence's decode")
      ->excludes(amx_all);
  bool gguf_dequantize = false;
  app.add_flag("--gguf-dequantize", gguf_dequantize,
               "Decode a GGUF's quantized weights to f32 at load and multiply in f32 (exact "
               "products, f32's memory); by default Q4_0..Q8_0 and Q2_K..Q6_K stay quantized in "
               "memory and multiply natively against activations quantized per row to int8");
  std::string max_isa = "native";
  app.add_option("--max-isa", max_isa,
                 "Use at most this much of the CPU's instruction set, as a lesser CPU would: "
                 "'native' (all it has), 'avx512' (no AMX), 'avx2' (no AVX-512 kernels), "
                 "'portable' (no hand-written SIMD kernels, Highway's SSE4 target)")
      ->envname("SWITCHYARD_MAX_ISA")
      ->check(CLI::IsMember({"native", "avx512", "avx2", "portable"}));
  std::string prefill_gemm = "own";
  app.add_option("--prefill-gemm", prefill_gemm,
                 "GEMM for prefill-sized products (256 rows and more): 'own' (the default) keeps "
                 "our kernels, whose rows do not depend on the batch, so a greedy request gets one "
                 "answer whether or not its prefix was cached; 'auto' times ours against oneDNN's "
                 "bf16 matmul once per weight shape where the CPU has one (AMX, AVX-512 BF16) and "
                 "keeps the faster, else ours; 'measure' times them on every CPU; 'onednn' always "
                 "oneDNN (weights dequantized to bf16, or f32, a block at a time). With oneDNN, "
                 "prefill is faster but answers may depend on batching and the prefix cache")
      ->check(CLI::IsMember({"auto", "measure", "own", "onednn"}));
  app.parse_complete_callback([&] {
    if (threads > usable)
      std::fprintf(stderr,
                   "switchyard: note: --threads %d is more than the %d core(s) this process may "
                   "use (its CPU affinity or quota); the threads will share cores\n",
                   threads, usable);
    sy::kernels::SetMaxIsaLevel(*sy::kernels::ParseIsaLevel(max_isa));
    sy::ThreadPool::ConfigureGlobal(threads);
    if (f32_products) sy::kernels::GlobalKernelOptions().bf16_dot = false;
    // Products and attention on the tiles, bf16 weights laid out as the tiles at load (no
    // conversion per product): by default on the CPU's tiles, and with --amx-bf16 wherever a
    // backend runs them (the emulator included).
    const sy::kernels::AmxBackend backend = sy::kernels::ActiveAmxBackend();
    if (!amx_bf16_all && !amx_bf16_none && !f32_products &&
        backend == sy::kernels::AmxBackend::kHardware) {
      sy::kernels::GlobalKernelOptions().amx_bf16 = true;
      sy::GlobalBf16Pairs() = true;
    }
    if (amx_bf16_all && !f32_products) {
      sy::kernels::GlobalKernelOptions().amx_bf16 = true;
      sy::GlobalBf16Pairs() = backend != sy::kernels::AmxBackend::kNone;
      if (backend == sy::kernels::AmxBackend::kNone)
        std::fprintf(stderr, "switchyard: note: --amx-bf16 has no effect here: %s\n",
                     sy::kernels::Amx().state == sy::kernels::AmxState::kReady
                         ? "--max-isa keeps AMX off"
                         : sy::kernels::Amx().detail.c_str());
    }
    // bf16 weights in pairs for the AVX-512 BF16 dot kernel as well: its operands as stored, read
    // in place instead of converted per product (bf16_dot.cc).
    if (!f32_products && sy::kernels::GlobalKernelOptions().bf16_dot && sy::kernels::HasBf16Dot())
      sy::GlobalBf16DotPairs() = true;
    if (int8_products) sy::GlobalWeightPacking() = sy::WeightPacking::kInt8;
    if (gguf_dequantize) sy::GlobalGgufWeights() = sy::GgufWeights::kDequantized;
    if (prefill_gemm != "own") sy::kernels::GlobalKernelOptions().allow_bf16_gemm = true;
    using sy::kernels::PrefillGemm;
    sy::kernels::GlobalPrefillGemm() = prefill_gemm == "measure"  ? PrefillGemm::kMeasure
                                       : prefill_gemm == "own"    ? PrefillGemm::kOwn
                                       : prefill_gemm == "onednn" ? PrefillGemm::kOnednn
                                                                  : PrefillGemm::kAuto;
  });
  sy::AddLogitsVerb(app);
  sy::AddGenerateVerb(app);
  sy::AddInitModelVerb(app);
  sy::AddPlanVerb(app);
  sy::AddBenchVerb(app);
  sy::AddTokenizeVerb(app);
  sy::AddServeVerb(app);
  sy::AddRunBatchVerb(app);
  sy::AddRouteVerb(app);
  sy::AddEplbVerb(app);
  sy::AddQuantizeVerb(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
