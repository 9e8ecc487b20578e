// The op kinds of core/ops.def as core/op_support.h tabulates them: every value named once, and
// the precision table as core/device.h's mixed-precision comment states it.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/op_support.h"

namespace ct {
namespace {

TEST(OpTable, EveryKindNamedOnce) {
  std::set<std::string> names;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const char* name = op_kind_name(static_cast<OpKind>(i));
    ASSERT_NE(name, nullptr) << "OpKind " << i;
    EXPECT_TRUE(names.insert(name).second) << "OpKind " << i << " repeats the name " << name;
  }
  // The plugin ABI's numbers (core/ops.def: never renumbered).
  EXPECT_EQ(static_cast<int>(OpKind::kFill), 0);
  EXPECT_EQ(static_cast<int>(OpKind::kAdafactor), 21);
  EXPECT_EQ(static_cast<int>(OpKind::kRope), 24);
  EXPECT_STREQ(op_kind_name(OpKind::kRMSNorm), "rmsnorm");
  EXPECT_STREQ(op_kind_name(static_cast<OpKind>(kNumOpKinds)), "unknown op kind");
}

TEST(OpTable, PrecisionTableIsDeviceHs) {
  const std::set<OpKind> half = {OpKind::kAdd,       OpKind::kEmbedding, OpKind::kMatmul,
                                 OpKind::kLayerNorm, OpKind::kRMSNorm,   OpKind::kSwiGLU,
                                 OpKind::kRope,      OpKind::kBiasGrad,  OpKind::kAttention,
                                 OpKind::kGelu,      OpKind::kDropout,   OpKind::kCrossEntropy};
  for (int i = 0; i < kNumOpKinds; ++i) {
    const OpKind op = static_cast<OpKind>(i);
    const bool any = op == OpKind::kFill || op == OpKind::kCopy;
    for (int d = 0; d < kNumDTypes; ++d) {
      const DType dt = static_cast<DType>(d);
      bool want = any || dt == DType::f32;
      if ((dt == DType::f16 || dt == DType::bf16) && half.count(op)) want = true;
      if (op == OpKind::kAdamW8bit && dt == DType::u8) want = true;
      EXPECT_EQ(precision_table_allows(op, dt), want) << op_kind_name(op) << " " << dtype_name(dt);
    }
  }
  EXPECT_FALSE(precision_table_allows(static_cast<OpKind>(kNumOpKinds), DType::f32));
}

}  // namespace
}  // namespace ct
