// The command-line verbs. Each registers a subcommand; a failing verb prints one line to stderr
// and throws CLI::RuntimeError with a non-zero exit code.
#pragma once

#include <CLI/CLI.hpp>

namespace sy {

void AddLogitsVerb(CLI::App& app);
void AddGenerateVerb(CLI::App& app);
void AddInitModelVerb(CLI::App& app);
void AddPlanVerb(CLI::App& app);
void AddBenchVerb(CLI::App& app);
void AddTokenizeVerb(CLI::App& app);
void AddServeVerb(CLI::App& app);
void AddRunBatchVerb(CLI::App& app);
void AddRouteVerb(CLI::App& app);
void AddEplbVerb(CLI::App& app);
void AddQuantizeVerb(CLI::App& app);
// `bench layer` and `bench decode`, registered under `bench`.
void AddBenchLayerCommand(CLI::App& bench);
void AddBenchDecodeCommand(CLI::App& bench);
void AddBenchExchangeCommand(CLI::App& bench);
void AddBenchTokenizerCommand(CLI::App& bench);
void AddBenchChatTemplateCommand(CLI::App& bench);
void AddBenchServeCommand(CLI::App& bench);
void AddBenchMtpCommand(CLI::App& bench);
void AddBenchBeamSearchCommand(CLI::App& bench);
void AddBenchAccuracyCommand(CLI::App& bench);
void AddBenchTransferCommand(CLI::App& bench);

// Prints "error: message" and aborts the verb with exit code 1.
[[noreturn]] void FailVerb(const std::string& message);

}  // namespace sy
