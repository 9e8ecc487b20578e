#include "core/train/evaluate.h"

#include <algorithm>

#include "core/data/batch_loader.h"
#include "core/error.h"

namespace ct {

EvalResult evaluate(Model& model, std::span<const int32_t> tokens, int T, int batch,
                    int64_t max_batches) {
  Device& dev = model.device();
  EvalResult r;
  int64_t windows = eval_windows(static_cast<int64_t>(tokens.size()), T);
  if (max_batches > 0) windows = std::min<int64_t>(windows, max_batches * batch);
  if (windows == 0) return r;
  Tensor inputs = dev.empty({batch, T}, DType::i32, MemCategory::kActivations);
  Tensor targets = dev.empty({batch, T}, DType::i32, MemCategory::kActivations);
  double weighted = 0;
  for (int64_t first = 0; first < windows; first += batch) {
    int64_t count = std::min<int64_t>(batch, windows - first);
    Batch b = eval_batch(tokens, T, first, count);
    int B = static_cast<int>(count);
    Tensor in = inputs.slice_flat(0, {B, T});
    Tensor tg = targets.slice_flat(0, {B, T});
    dev.upload(in, b.inputs.data(), b.inputs.size() * sizeof(int32_t));
    dev.upload(tg, b.targets.data(), b.targets.size() * sizeof(int32_t));
    Tensor loss = model.forward(in, &tg, B, T);
    float l = 0;
    dev.download(&l, loss, sizeof l);
    weighted += static_cast<double>(l) * static_cast<double>(count);
    r.windows += count;
  }
  r.tokens = r.windows * T;
  r.loss = weighted / static_cast<double>(r.windows);
  return r;
}

}  // namespace ct
