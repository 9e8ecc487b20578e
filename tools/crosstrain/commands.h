// The subcommands of the crosstrain tool. Each registers its flags on `app` and returns the
// function that runs it (returning the process exit status).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace ct::cli {

using Run = std::function<int()>;

Run add_train(CLI::App& app);
Run add_eval(CLI::App& app);
Run add_generate(CLI::App& app);
Run add_devices(CLI::App& app);
Run add_bench(CLI::App& app);
Run add_prepare_data(CLI::App& app);
Run add_merge_lora(CLI::App& app);

}  // namespace ct::cli
