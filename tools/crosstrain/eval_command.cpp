#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/data/text_dataset.h"
#include "core/data/text_tokenizer.h"
#include "core/data/token_file.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/train/evaluate.h"
#include "core/train/model_files.h"
#include "tools/crosstrain/cli_util.h"
#include "tools/crosstrain/commands.h"

namespace ct::cli {

Run add_eval(CLI::App& app) {
  struct Opts {
    std::string model_path, data, backend = "cpu";
    int batch = 4, block_size = 0;
  };
  auto o = std::make_shared<Opts>();
  flag(&app, "--model-path", o->model_path, "folder with config.json and model.safetensors")
      ->required();
  flag(&app, "--data", o->data,
       "text file or folder, llm.c token file or nanoGPT .bin to evaluate on")
      ->required();
  flag(&app, "--block-size", o->block_size, "window length (0 = the model's n_positions)");
  flag(&app, "--backend", o->backend, "auto, cpu, cuda, hip, vulkan, vulkan:N, ...");
  flag(&app, "--per-device-eval-batch-size", o->batch, "windows per forward pass");
  return [o] {
    if (o->batch <= 0)
      fail(ErrorKind::kInvalidArgument,
           "--per-device-eval-batch-size " + std::to_string(o->batch) + ": must be > 0");
    const ModelConfig config = read_model_config(o->model_path);
    if (o->block_size < 0 || o->block_size > config.block_size())
      fail(ErrorKind::kInvalidArgument, "--block-size " + std::to_string(o->block_size) +
                                            ": must be in [0, the model's longest sequence " +
                                            std::to_string(config.block_size()) + "]");
    std::vector<int32_t> tokens;
    if (detect_data_format(o->data) != DataFormat::kText) {
      tokens = read_token_file(o->data, config.vocab_size());
    } else {
      auto tok = tokenizer_for_model(o->model_path);
      tokens = tok->encode_parallel(load_text(o->data, 1), 2);
    }
    auto device = open_device(o->backend);
    auto model = load_model(o->model_path, *device);
    int T = o->block_size > 0 ? o->block_size : config.block_size();
    if (static_cast<int64_t>(tokens.size()) < T + 1)
      fail(ErrorKind::kInvalidArgument, "--data " + o->data + ": " + std::to_string(tokens.size()) +
                                            " tokens, fewer than one window of " +
                                            std::to_string(T + 1));
    model->allocate_activations(o->batch, T);
    EvalResult r = evaluate(*model, tokens, T, o->batch);
    std::printf("%s\n", nlohmann::json{{"eval_loss", r.loss}, {"tokens", r.tokens}}.dump().c_str());
    return 0;
  };
}

Run add_generate(CLI::App& app) {
  struct Opts {
    std::string model_path, prompt, backend = "cpu";
    int max_new_tokens = 200, top_k = 40;
    float temperature = 0.8f;
    uint64_t seed = 42;
    bool no_kv_cache = false;
    bool stats = false;
    bool bf16 = false, fp16 = false;
  };
  auto o = std::make_shared<Opts>();
  flag(&app, "--model-path", o->model_path, "folder with config.json and model.safetensors")
      ->required();
  flag(&app, "--prompt", o->prompt, "text to continue")->required();
  flag(&app, "--max-new-tokens", o->max_new_tokens, "tokens to generate");
  flag(&app, "--temperature", o->temperature, "sampling temperature (0 = greedy)");
  flag(&app, "--top-k", o->top_k, "sample among the k most likely tokens (0 = all)");
  flag(&app, "--seed", o->seed, "sampling seed");
  flag(&app, "--backend", o->backend, "auto, cpu, cuda, hip, vulkan, vulkan:N, ...");
  app.add_flag("--no-kv-cache", o->no_kv_cache,
               "run every token's forward over the whole window (transformers' use_cache=False)");
  app.add_flag("--bf16", o->bf16,
               "products in bf16 (a bf16 copy of the weights; transformers' torch_dtype=bfloat16)");
  app.add_flag("--fp16", o->fp16, "products in fp16 (a fp16 copy of the weights)")
      ->excludes("--bf16");
  app.add_flag("--stats", o->stats,
               "after the text, one JSON line on stderr: prompt and new tokens, seconds to the "
               "first token and for the others, tokens/s after the first");
  return [o] {
    if (o->prompt.empty()) fail(ErrorKind::kInvalidArgument, "--prompt: must not be empty");
    if (o->max_new_tokens < 0)
      fail(ErrorKind::kInvalidArgument,
           "--max-new-tokens " + std::to_string(o->max_new_tokens) + ": must be >= 0");
    if (o->top_k < 0)
      fail(ErrorKind::kInvalidArgument, "--top-k " + std::to_string(o->top_k) + ": must be >= 0");
    auto device = open_device(o->backend);
    ModelOptions mo;
    if (o->bf16 || o->fp16)
      mo.policy = PrecisionPolicy::make(o->bf16 ? Precision::kBf16 : Precision::kFp16);
    auto model = load_model(o->model_path, *device, mo);
    auto tok = tokenizer_for_model(o->model_path);
    SampleOptions so;
    so.temperature = o->temperature;
    so.top_k = o->top_k;
    so.seed = o->seed;
    so.kv_cache = !o->no_kv_cache;
    GenerateStats st;
    auto out = model->generate(tok->encode(o->prompt), o->max_new_tokens, so, &st);
    std::printf("%s%s\n", o->prompt.c_str(), tok->decode(out).c_str());
    if (o->stats) {
      std::fflush(stdout);  // the text first where both go to one file
      const double rate = st.new_tokens > 1 ? (st.new_tokens - 1) / st.decode_s : 0.0;
      std::fprintf(stderr, "%s\n",
                   nlohmann::json{{"prompt_tokens", st.prompt_tokens},
                                  {"new_tokens", st.new_tokens},
                                  {"first_token_s", st.prefill_s},
                                  {"decode_s", st.decode_s},
                                  {"decode_tokens_per_s", rate},
                                  {"kv_cache", so.kv_cache},
                                  {"precision", mo.policy.name()},
                                  {"device", device->info().name}}
                       .dump()
                       .c_str());
    }
    return 0;
  };
}

}  // namespace ct::cli
