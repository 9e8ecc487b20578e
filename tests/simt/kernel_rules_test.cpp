// The rules every file under backends/gpu/kernels keeps, so that one source stays correct on
// CUDA, HIP (warp 32 or 64) and the SIMT runtime: explicit launch bounds, checked in the body
// with the same spelling (the SIMT runtime enforces them only there), and a shape comment at
// every kernel, shuffles and votes only through the width-taking wrappers with a WARP-derived
// width, shared memory only through CT_SHARED / CT_DYNAMIC_SHARED, and no atomics that could
// sum floats in a timing-dependent order (determinism: integer flags use atomicOr / atomicMax).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The argument of the first `call` (which ends in '(') in text, spaces collapsed; "" if none.
std::string call_argument(const std::string& text, const std::string& call) {
  const std::size_t open = text.find(call);
  if (open == std::string::npos) return "";
  std::string arg;
  int depth = 1;
  for (std::size_t k = open + call.size(); k < text.size(); ++k) {
    depth += text[k] == '(' ? 1 : text[k] == ')' ? -1 : 0;
    if (depth == 0) return arg;
    if (text[k] != ' ' || (!arg.empty() && arg.back() != ' ')) arg += text[k];
  }
  return "";
}

std::vector<std::string> rule_violations(const std::string& src) {
  std::vector<std::string> lines;
  std::istringstream in(src);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::vector<std::string> bad;
  auto report = [&](std::size_t i, const std::string& what) {
    bad.push_back("line " + std::to_string(i + 1) + ": " + what);
  };
  const std::regex raw_collective(R"(\b__(shfl\w*|ballot\w*|any\w*|all\w*|activemask)\s*\()");
  const std::regex literal_width(R"(\bct_shfl_\w+\(.*,\s*(32|64)\s*\))");
  const std::regex raw_shared(R"(\b__shared__\b)");
  const std::regex summing_atomic(R"(\batomic(Add|Sub|Exch|CAS)\s*\()");
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const std::string code = l.substr(0, l.find("//"));
    if (std::regex_search(code, raw_collective)) report(i, "a raw warp intrinsic: use ct_shfl_*");
    if (std::regex_search(code, literal_width)) report(i, "a literal warp width: use WARP");
    if (std::regex_search(code, raw_shared)) report(i, "__shared__: use CT_SHARED");
    if (std::regex_search(code, summing_atomic))
      report(i, "an order-dependent atomic: reduce through a fixed tree");
    if (code.find("__global__") == std::string::npos) continue;
    std::string text = code.substr(code.find("__global__"));  // up to the first statement's ';'
    for (std::size_t j = i + 1;
         j < lines.size() && (text.find('{') == std::string::npos ||
                              text.find(';', text.find('{')) == std::string::npos);
         ++j)
      text += ' ' + lines[j].substr(0, lines[j].find("//"));
    const std::string head = text.substr(0, text.find('{'));
    const std::string bound = call_argument(head, "CT_LAUNCH_BOUNDS(");
    if (bound.empty()) report(i, "a kernel without bounds");
    const std::size_t brace = text.find('{');
    const std::string first = brace == std::string::npos ? "" : text.substr(brace + 1);
    if (first.find_first_not_of(" ") != first.find("CT_CHECK_LAUNCH_BOUNDS(") ||
        call_argument(first, "CT_CHECK_LAUNCH_BOUNDS(") != bound)
      report(i, "a kernel that does not start with CT_CHECK_LAUNCH_BOUNDS(" + bound + ")");
    std::size_t k = i;
    while (k > 0 && lines[k - 1].find("template") != std::string::npos) --k;
    if (k == 0 || lines[k - 1].find("//") == std::string::npos)
      report(i, "a kernel without a shape comment above it");
  }
  return bad;
}

TEST(KernelRules, TheCheckerFindsEachBrokenRule) {
  const std::string broken =
      "template <int WARP>\n"
      "__global__ void no_comment(float* x) {\n"
      "  __shared__ float s[32];\n"
      "  x[0] = __shfl_down_sync(0xffffffff, x[0], 1, 32);\n"
      "  x[1] = ct_shfl_xor(x[1], 1, 32);\n"
      "  atomicAdd(x + 2, x[1]);\n"
      "}\n"
      "// x is (n)\n"
      "__global__ void no_bounds(float* x) {}\n"
      "// x is (n)\n"
      "template <int WARP>\n"
      "__global__ void CT_LAUNCH_BOUNDS(4 * WARP) other_check(float* x) {\n"
      "  CT_CHECK_LAUNCH_BOUNDS(2 * WARP);\n"
      "}\n";
  const auto bad = rule_violations(broken);
  const std::string all = ::testing::PrintToString(bad);
  EXPECT_EQ(bad.size(), 10u) << all;  // no_comment lacks bounds and their check too
  for (const char* what :
       {"shape comment", "__shared__", "raw warp intrinsic", "literal warp width", "without bounds",
        "order-dependent atomic", "does not start with CT_CHECK_LAUNCH_BOUNDS(4 * WARP)"})
    EXPECT_NE(all.find(what), std::string::npos) << what << " in " << all;
  EXPECT_TRUE(rule_violations("// x is (n)\ntemplate <int WARP>\n__global__ void "
                              "CT_LAUNCH_BOUNDS(4 * WARP)\n    k(float* x) {\n"
                              "  CT_CHECK_LAUNCH_BOUNDS(4  *  WARP);  // the bound\n"
                              "  x[0] = ct_shfl_down(x[0], 1, WARP);\n}\n")
                  .empty());
}

TEST(KernelRules, EveryKernelFileKeepsThem) {
  int files = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(CT_SOURCE_DIR) + "/backends/gpu/kernels")) {
    if (e.path().extension() != ".cu") continue;
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_EQ(rule_violations(ss.str()), std::vector<std::string>{}) << e.path();
    ++files;
  }
  EXPECT_GE(files, 9);  // one per op family
}

}  // namespace
