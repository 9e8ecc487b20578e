// The dynamic 8-bit codes of block-wise 8-bit optimizers (Dettmers et al., "8-bit Optimizers via
// Block-wise Quantization", 2022): 256 values in [-1, 1] (signed) or [0, 1] (unsigned), dense
// near zero and sparse near one, so that normalised optimizer states lose little precision.
//
// Construction (bitsandbytes' create_dynamic_map with 7 exponent bits, written from its
// description): for each decade k = 0..6 (scale 10^(k-6)), split [0.1, 1] into equal intervals
// (2^k of them for the signed code, 2^(k+1) for the unsigned one) and take each interval's
// midpoint times the scale; the signed code adds the negatives of these. Add 0 and 1, sort
// ascending: 254 + 2 = 256 values. Computed in fp64 and rounded to fp32 once.
#pragma once

#include <array>

namespace ct {

// Sorted ascending; index 0 is -0.99..., the largest is 1. Contains 0.
const std::array<float, 256>& dynamic_map_signed();
// Sorted ascending; index 0 is 0, index 255 is 1.
const std::array<float, 256>& dynamic_map_unsigned();

}  // namespace ct
