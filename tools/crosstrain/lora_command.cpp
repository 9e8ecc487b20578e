// crosstrain merge-lora: a base model folder plus PEFT LoRA adapters -> one full model folder.
#include <cstdio>
#include <memory>

#include "core/train/adapter_files.h"
#include "tools/crosstrain/cli_util.h"
#include "tools/crosstrain/commands.h"

namespace ct::cli {

Run add_merge_lora(CLI::App& app) {
  struct Opts {
    std::string base, adapter, output;
  };
  auto o = std::make_shared<Opts>();
  flag(&app, "--model-name-or-path", o->base, "the base model folder the adapters were trained on")
      ->required();
  flag(&app, "--adapter", o->adapter,
       "folder with adapter_config.json and adapter_model.safetensors (a LoRA run's output)")
      ->required();
  flag(&app, "--output-dir", o->output, "where the merged config.json and model.safetensors go")
      ->required();
  return [o] {
    merge_lora(o->base, o->adapter, o->output);
    std::printf("merged %s into %s: %s\n", o->adapter.c_str(), o->base.c_str(), o->output.c_str());
    return 0;
  };
}

}  // namespace ct::cli
