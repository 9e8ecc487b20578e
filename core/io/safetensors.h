// The safetensors format (https://github.com/huggingface/safetensors): u64 little-endian header
// length N, N bytes of JSON header {name: {dtype, shape, data_offsets: [begin, end]}, ...,
// "__metadata__": {string: string}}, then the data section; offsets are relative to its start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace ct {

// Largest header accepted (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// "F32", "F16", "BF16", "I8", "U8", "I32".
const char* safetensors_dtype_name(DType dtype);

// One tensor to write: `data` holds numel(shape) * dtype_size(dtype) bytes, row-major.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

// Writes `tensors` (data in the given order, header padded with spaces to a multiple of 8 so the
// data section is 8-byte aligned) and `metadata` as "__metadata__" (omitted when empty) to
// `path`, atomically (see write_file_atomic). Throws Error(kInvalidArgument) naming the path and
// tensor for a duplicate or reserved name, a negative dimension, or a data size that does not
// match the shape; Error(kIo) if the file cannot be written.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafetensorsInfo {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range [begin, end) within the data section
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  // The shape as a ct::Shape; throws Error(kInvalidArgument) if it has more than kMaxDims dims.
  Shape to_shape() const;
};

// A validated, memory-mapped safetensors file. Move-only; spans from data() live as long as it.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensor names in data-section order.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  // Dtype, shape and byte range of `name`; Error(kInvalidArgument) naming the file and the
  // tensor if it is absent.
  const SafetensorsInfo& info(const std::string& name) const;
  // The bytes of `name` (little-endian, row-major), valid while this object lives.
  std::span<const std::byte> data(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  friend SafetensorsFile read_safetensors(const std::string& path);
  void release();

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const std::byte* data_start_ = nullptr;  // start of the data section within the mapping
  std::vector<std::string> names_;
  std::map<std::string, SafetensorsInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// Maps and validates the file at `path`. Error(kIo) naming the path if it cannot be opened or
// mapped; Error(kInvalidArgument) naming the path and the broken rule if the file is shorter than
// 8 bytes, the header length exceeds kSafetensorsMaxHeaderBytes or the file, the header is not a
// JSON object or has duplicate keys, a dtype is unknown or unsupported (F64, I64, ...), a shape is
// not a list of non-negative integers, data_offsets is not [begin, end] with begin <= end, a byte
// length differs from numel * dtype size, the ranges are not contiguous from 0 without gaps or
// overlaps, the data does not end exactly at the end of the file, or "__metadata__" is not a
// string -> string map.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace ct
