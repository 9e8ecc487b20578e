// Validation loss over consecutive non-overlapping windows of a token stream.
#pragma once

#include <cstdint>
#include <span>

#include "core/model/model.h"

namespace ct {

struct EvalResult {
  double loss = 0;     // mean next-token cross-entropy over every target position evaluated
  int64_t tokens = 0;  // number of target positions evaluated
  int64_t windows = 0;
};

// Window k: inputs t[kT, kT+T), targets t[kT+1, kT+T+1); only windows that fit. Runs batches
// of up to `batch` windows; max_batches > 0 caps how many batches are run (0 = all).
// `model` must have activations for at least batch x T.
EvalResult evaluate(Model& model, std::span<const int32_t> tokens, int T, int batch,
                    int64_t max_batches = 0);

}  // namespace ct
