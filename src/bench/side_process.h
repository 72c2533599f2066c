// What the side-by-side benches share: a reference run in a subprocess (Hugging Face's Python
// libraries, timed inside it), read back whole, and timings summarised as min/median/max.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "base/status.h"

namespace sy::bench {

struct Timing {
  double median = 0, min = 0, max = 0;
};
Timing Summarize(std::vector<double> times);

// Everything a popen()ed process writes.
std::string ReadAll(FILE* pipe);
// A single-quoted shell word.
std::string ShellQuote(const std::string& s);
// A file name in the temporary directory, unique to this process: sy-bench-STEM-PID.EXT.
std::string ScratchPath(const std::string& stem, const std::string& extension);
// Runs `python script args…` (the script written to a scratch file) with `environment`
// prepended ("NAME=value …"), and returns what it printed; an error with its output when it
// fails.
Result<std::string> RunPythonScript(const std::string& python, const char* script,
                                    const std::vector<std::string>& args,
                                    const std::string& environment = "");

}  // namespace sy::bench
