// crosstrain: train, evaluate and sample GPT-2 models on any backend from one binary.
#include <cstdio>
#include <map>
#include <string>

#include "core/dist/communicator.h"
#include "core/error.h"
#include "core/registry.h"
#include "tools/crosstrain/commands.h"

int main(int argc, char** argv) {
  ct::ShutdownBackendsOnReturn shutdown;  // first: the backends close after everything else
  CLI::App app{"crosstrain: train GPT-2 models on CPU, Vulkan, CUDA and HIP from one binary"};
  app.require_subcommand(1);
  std::map<CLI::App*, ct::cli::Run> runs;
  auto add = [&](const char* name, const char* help, ct::cli::Run (*reg)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    runs[sub] = reg(*sub);
  };
  add("train", "train a model and write it to --output-dir", ct::cli::add_train);
  add("eval", "print the validation loss of a saved model on a text file as JSON",
      ct::cli::add_eval);
  add("prepare-data", "tokenize text into an llm.c token file (--tokenizer, --data, --output)",
      ct::cli::add_prepare_data);
  add("merge-lora", "merge LoRA adapters into their base model (a full model folder)",
      ct::cli::add_merge_lora);
  add("generate", "sample text from a saved model", ct::cli::add_generate);
  add("bench",
      "benchmarks: --report DIR (every device, one report), --merge OUT FILE..., --techniques",
      ct::cli::add_bench);
  add("devices", "list every backend and device, or why it is unavailable", ct::cli::add_devices);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "crosstrain: %s\nRun with --help for the flags.\n", e.what());
    return 2;
  }
  for (auto& [sub, run] : runs) {
    if (!sub->parsed()) continue;
    // Data parallel: an error names its rank, and ends every rank (the others would wait for
    // this one in their next all-reduce).
    auto report = [&](const char* what, int code) {
      std::string rank;
      if (ct::dist::world_is_distributed())
        rank = "rank " + std::to_string(ct::dist::world().rank()) + ": ";
      std::fprintf(stderr, "crosstrain %s: %serror: %s\n", sub->get_name().c_str(), rank.c_str(),
                   what);
      std::fflush(stderr);
      ct::dist::abort_world(code);
      return code;
    };
    try {
      int rc = run();
      ct::dist::finalize_world();
      return rc;
    } catch (const ct::Error& e) {
      return report(e.what(), e.kind() == ct::ErrorKind::kInvalidArgument ? 2 : 1);
    } catch (const std::exception& e) {
      return report(e.what(), 1);
    }
  }
  return 2;
}
