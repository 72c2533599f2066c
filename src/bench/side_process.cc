#include "bench/side_process.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace sy::bench {

Timing Summarize(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front(), times.back()};
}

std::string ReadAll(FILE* pipe) {
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    out.append(buffer, n);
  return out;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string ScratchPath(const std::string& stem, const std::string& extension) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("sy-bench-{}-{}{}", stem, ::getpid(), extension))
      .string();
}

Result<std::string> RunPythonScript(const std::string& python, const char* script,
                                    const std::vector<std::string>& args,
                                    const std::string& environment) {
  const std::string path = ScratchPath("script", ".py");
  std::ofstream(path) << script;
  std::string command = environment;
  if (!command.empty()) command.append(" ");
  command.append(ShellQuote(python)).append(" ").append(ShellQuote(path));
  for (const std::string& arg : args)
    command.append(" ").append(ShellQuote(arg));
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output = pipe ? ReadAll(pipe) : "";
  const int status = pipe ? ::pclose(pipe) : -1;
  std::filesystem::remove(path);
  if (status != 0) return Status::Errorf("{} failed (exit {}): {}", python, status, output);
  return output;
}

}  // namespace sy::bench
