// CLI11 helpers: every flag is accepted with dashes or underscores (--max-steps, --max_steps).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace ct::cli {

// "--max-steps" -> "--max-steps,--max_steps"
inline std::string names(const std::string& dashed) {
  std::string under = dashed;
  for (size_t i = 2; i < under.size(); ++i)
    if (under[i] == '-') under[i] = '_';
  return under == dashed ? dashed : dashed + "," + under;
}

template <typename T>
CLI::Option* flag(CLI::App* app, const std::string& dashed, T& value, const std::string& help) {
  return app->add_option(names(dashed), value, help)
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as argparse: the last wins
}

}  // namespace ct::cli
