// The crosstrain binary run as a user runs it, for the CLI tests: its exit status and output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace ct::test {

struct ProcResult {
  int status = -1;
  std::string output;  // stdout and stderr together
};

// `crosstrain <args>` (CT_CROSSTRAIN_BIN) through the shell.
inline ProcResult run_crosstrain(const std::string& args) {
  std::string cmd = std::string(CT_CROSSTRAIN_BIN) + " " + args + " 2>&1";
  ProcResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace ct::test
