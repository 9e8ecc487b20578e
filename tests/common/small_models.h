// The two-layer models the model suites run on every device: width 64 in 4 heads (Llama: 2
// key/value heads, MLP 96), with the caller's context length and vocabulary.
#pragma once

#include "core/model/gpt2.h"
#include "core/model/llama.h"

namespace ct::test {

inline GPT2Config two_layer_gpt2(int block_size, int vocab) {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = block_size;
  c.vocab_size = vocab;
  return c;
}

inline LlamaConfig two_layer_llama(int block_size, int vocab) {
  LlamaConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 64;
  c.intermediate_size = 96;
  c.block_size = block_size;
  c.vocab_size = vocab;
  return c;
}

}  // namespace ct::test
