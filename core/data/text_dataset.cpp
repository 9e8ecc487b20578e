#include "core/data/text_dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/io/read_file.h"

namespace fs = std::filesystem;

namespace ct {
namespace {

bool is_hidden(const fs::path& p) {
  std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

std::string load_folder(const std::string& root) {
  std::vector<fs::path> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::none, ec), end;
  if (ec) fail(ErrorKind::kIo, "cannot list folder '" + root + "': " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) fail(ErrorKind::kIo, "cannot list folder '" + root + "': " + ec.message());
    const fs::directory_entry& e = *it;
    if (is_hidden(e.path())) {
      if (e.is_directory(ec) && !e.is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    if (e.is_symlink(ec)) continue;  // the iterator does not follow directory links either
    if (!e.is_regular_file(ec)) continue;
    if (e.path().extension() == ".dat") continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());

  std::string out;
  for (const fs::path& p : files) {
    std::string text = read_file_bytes(p.string());
    if (text.empty() || text.find('\0') != std::string::npos) continue;
    out += text;
    if (out.back() != '\n') out += '\n';
  }
  if (out.empty()) {
    fail(ErrorKind::kInvalidArgument,
         "folder '" + root +
             "' holds no text files (skipped: symlinks, hidden, *.dat, empty, "
             "and files with NUL bytes)");
  }
  return out;
}

}  // namespace

std::string load_text(const std::string& path, size_t min_bytes) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    fail(ErrorKind::kInvalidArgument, "training data '" + path + "' does not exist");
  }
  std::string text;
  if (fs::is_directory(st)) {
    text = load_folder(path);
  } else {
    text = read_file_bytes(path);
    if (text.empty()) fail(ErrorKind::kInvalidArgument, "training data '" + path + "' is empty");
  }
  if (text.size() < min_bytes) {
    fail(ErrorKind::kInvalidArgument, "training data '" + path + "' has " +
                                          std::to_string(text.size()) + " bytes, fewer than the " +
                                          std::to_string(min_bytes) + " needed");
  }
  return text;
}

TokenSplit split_train_val(std::span<const int32_t> tokens, double val_fraction, int64_t window) {
  CT_REQUIRE(val_fraction >= 0.0 && val_fraction < 1.0,
             "validation fraction must be in [0, 1), got " + std::to_string(val_fraction));
  CT_REQUIRE(window > 0, "window length must be positive, got " + std::to_string(window));
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
  const int64_t n_train = n - n_val;
  const int64_t need = window + 1;
  if (n_train < need || (val_fraction > 0.0 && n_val < need)) {
    fail(ErrorKind::kInvalidArgument,
         "cannot split " + std::to_string(n) + " tokens with validation fraction " +
             std::to_string(val_fraction) + ": train gets " + std::to_string(n_train) +
             " and validation " + std::to_string(n_val) + " tokens, each needs at least " +
             std::to_string(need) + " (one window of " + std::to_string(window) + " + 1)");
  }
  TokenSplit s;
  s.train.assign(tokens.begin(), tokens.begin() + n_train);
  s.val.assign(tokens.begin() + n_train, tokens.end());
  return s;
}

}  // namespace ct
