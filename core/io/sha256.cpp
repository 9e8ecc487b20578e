#include "core/io/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"

namespace ct {
namespace {

struct Digest {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx{EVP_MD_CTX_new(), EVP_MD_CTX_free};
  Digest() {
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
      fail(ErrorKind::kInternal, "SHA-256: EVP_DigestInit_ex failed");
  }
  void update(const void* data, size_t n) { EVP_DigestUpdate(ctx.get(), data, n); }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx.get(), md, &len);
    static const char* kHex = "0123456789abcdef";
    std::string out;
    for (unsigned i = 0; i < len; ++i) {
      out += kHex[md[i] >> 4];
      out += kHex[md[i] & 15];
    }
    return out;
  }
};

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  Digest d;
  d.update(bytes.data(), bytes.size());
  return d.hex();
}

std::string sha256_file(const std::string& path) {
  std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) fail(ErrorKind::kIo, "cannot read '" + path + "': " + std::strerror(errno));
  Digest d;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) d.update(buf.data(), n);
  if (std::ferror(f.get())) fail(ErrorKind::kIo, "error reading '" + path + "'");
  return d.hex();
}

}  // namespace ct
