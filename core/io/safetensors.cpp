#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/io/atomic_file.h"

namespace ct {
namespace {

using nlohmann::json;

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {{"F32", DType::f32},   {"F16", DType::f16},
                                     {"BF16", DType::bf16}, {"I8", DType::i8},
                                     {"U8", DType::u8},     {"I32", DType::i32}};
// Valid safetensors dtypes that crosstrain does not hold in memory.
constexpr const char* kUnsupportedDTypes[] = {"F64",     "I64",     "U64",     "U32",     "I16",
                                              "U16",     "BOOL",    "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                              "F6_E2M3", "F6_E3M2", "F4",      "C64"};

std::string supported_list() {
  std::string s;
  for (const auto& d : kDTypeNames) s += std::string(s.empty() ? "" : ", ") + d.name;
  return s;
}

// numel(shape) * elem, or false on overflow of uint64.
bool checked_nbytes(const std::vector<int64_t>& shape, uint64_t elem, uint64_t* out) {
  uint64_t n = elem;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void put_u64_le(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Parses a non-negative JSON integer that fits in int64 (shapes and offsets); false otherwise.
bool as_count(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = u;
  return true;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == dtype) return d.name;
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Writer

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  auto bad = [&](const std::string& what) {
    fail(ErrorKind::kInvalidArgument, "cannot write safetensors file '" + path + "': " + what);
  };
  json header = json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == "__metadata__") bad("tensor name '__metadata__' is reserved");
    if (!seen.insert(t.name).second) bad("duplicate tensor name '" + t.name + "'");
    uint64_t nbytes = 0;
    if (!checked_nbytes(t.shape, dtype_size(t.dtype), &nbytes))
      bad("tensor '" + t.name + "': invalid shape " + shape_str(t.shape));
    if (nbytes != t.data.size()) {
      bad("tensor '" + t.name + "': " + std::string(dtype_name(t.dtype)) + shape_str(t.shape) +
          " needs " + std::to_string(nbytes) + " bytes, got " + std::to_string(t.data.size()));
    }
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::type_error& e) {
    bad(std::string("header is not valid UTF-8: ") + e.what());
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');
  unsigned char len[8];
  put_u64_le(text.size(), len);

  write_file_atomic(path, [&](FileSink& sink) {
    sink.write(len, 8);
    sink.write(text);
    for (const SafetensorsTensor& t : tensors) sink.write(t.data.data(), t.data.size());
  });
}

// ---------------------------------------------------------------------------------------------
// Reader

int64_t SafetensorsInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Shape SafetensorsInfo::to_shape() const {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    fail(ErrorKind::kInvalidArgument, "shape " + shape_str(shape) + " has more than " +
                                          std::to_string(kMaxDims) + " dimensions");
  }
  Shape s;
  s.ndim = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) s.d[i] = shape[i];
  return s;
}

SafetensorsFile::~SafetensorsFile() {
  release();
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept {
  *this = std::move(o);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_start_ = std::exchange(o.data_start_, nullptr);
    names_ = std::move(o.names_);
    infos_ = std::move(o.infos_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

void SafetensorsFile::release() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  data_start_ = nullptr;
}

const SafetensorsInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) {
    fail(ErrorKind::kInvalidArgument,
         "safetensors file '" + path_ + "' has no tensor named '" + name + "'");
  }
  return it->second;
}

std::span<const std::byte> SafetensorsFile::data(const std::string& name) const {
  const SafetensorsInfo& i = info(name);
  return {data_start_ + i.begin, static_cast<size_t>(i.nbytes())};
}

SafetensorsFile read_safetensors(const std::string& path) {
  auto bad = [&](const std::string& what) {
    fail(ErrorKind::kInvalidArgument, "invalid safetensors file '" + path + "': " + what);
  };
  SafetensorsFile f;
  f.path_ = path;

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "cannot open '" + path + "': " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "'" + path + "' is not a readable regular file" +
                             (err ? std::string(": ") + std::strerror(err) : std::string()));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    bad("file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED)
    fail(ErrorKind::kIo, "cannot map '" + path + "': " + std::strerror(map_err));
  f.map_ = map;
  f.map_size_ = file_size;
  const auto* bytes = static_cast<const unsigned char*>(map);

  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  if (header_len > kSafetensorsMaxHeaderBytes) {
    bad("header length " + std::to_string(header_len) + " exceeds the limit of " +
        std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  }
  if (header_len > file_size - 8) {
    bad("header length " + std::to_string(header_len) + " runs past the end of the file (" +
        std::to_string(file_size) + " bytes)");
  }
  const char* hbegin = reinterpret_cast<const char*>(bytes + 8);
  const uint64_t data_size = file_size - 8 - header_len;
  f.data_start_ = reinterpret_cast<const std::byte*>(bytes + 8 + header_len);

  // nlohmann keeps the last of duplicate keys silently; the parse callback sees every key.
  std::vector<std::set<std::string>> key_stack;
  std::string duplicate;
  auto on_event = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      key_stack.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      key_stack.pop_back();
    } else if (ev == json::parse_event_t::key && !key_stack.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!key_stack.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(hbegin, hbegin + header_len, on_event);
  } catch (const json::exception& e) {
    bad(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) bad("header is not a JSON object");
  if (!duplicate.empty()) bad("header has duplicate key '" + duplicate + "'");

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad("\"__metadata__\" is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          bad("\"__metadata__\" value of '" + m.key() + "' is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!v.is_object()) bad(where + "entry is not an object");
    SafetensorsInfo info;

    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) bad(where + "missing or non-string \"dtype\"");
    const std::string dname = dt->get<std::string>();
    bool found = false;
    for (const auto& d : kDTypeNames) {
      if (dname == d.name) {
        info.dtype = d.dtype;
        found = true;
      }
    }
    if (!found) {
      for (const char* u : kUnsupportedDTypes) {
        if (dname == u) {
          bad(where + "dtype '" + dname + "' is not supported (crosstrain reads " +
              supported_list() + ")");
        }
      }
      bad(where + "unknown dtype '" + dname + "'");
    }

    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) bad(where + "\"shape\" is missing or not a list");
    for (const json& d : *sh) {
      uint64_t n = 0;
      if (!as_count(d, &n))
        bad(where + "\"shape\" " + sh->dump() + " is not a list of non-negative integers");
      info.shape.push_back(static_cast<int64_t>(n));
    }

    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 ||
        !as_count((*off)[0], &info.begin) || !as_count((*off)[1], &info.end)) {
      bad(where + "\"data_offsets\" is missing or not [begin, end] of non-negative integers");
    }
    if (info.begin > info.end) bad(where + "\"data_offsets\" " + off->dump() + " has begin > end");

    uint64_t expect = 0;
    if (!checked_nbytes(info.shape, dtype_size(info.dtype), &expect)) {
      bad(where + "shape " + shape_str(info.shape) + " overflows the byte size");
    }
    if (expect != info.end - info.begin) {
      bad(where + "data_offsets " + off->dump() + " span " + std::to_string(info.end - info.begin) +
          " bytes but " + dname + shape_str(info.shape) + " needs " + std::to_string(expect));
    }
    auto [slot, inserted] = f.infos_.emplace(name, std::move(info));
    CT_CHECK(inserted, "duplicate keys are rejected above");
    ranges.push_back({slot->second.begin, slot->second.end, &slot->first});
  }

  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (const Range& r : ranges) {
    if (r.begin != pos) {
      bad("tensor '" + *r.name + "' starts at data offset " + std::to_string(r.begin) +
          (r.begin > pos ? " leaving a gap after offset " : " overlapping data before offset ") +
          std::to_string(pos));
    }
    pos = r.end;
    f.names_.push_back(*r.name);
  }
  if (pos != data_size) {
    bad("tensor data ends at offset " + std::to_string(pos) + " but the data section is " +
        std::to_string(data_size) + " bytes (the data must end exactly at the end of the file)");
  }
  return f;
}

}  // namespace ct
