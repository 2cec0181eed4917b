// GGUF v2/v3 reader over a read-only memory map.
//
// A `gguf::file` owns the mapping; tensor data pointers and metadata string views stay valid
// for the file's lifetime. Every structural problem throws `gguf::error` whose message names
// the file, the byte offset and what was expected there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sy::gguf {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class value_type : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

// ggml tensor types (the numbering is the file format's). Only these are accepted; any other
// id is reported as "unknown tensor type".
enum class tensor_type : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  bf16 = 30,
};

const char* type_name(tensor_type t);
// Elements per quantization block and bytes per block (1 and sizeof(element) for f32/f16/bf16).
// Both are 0 for an id outside tensor_type (type_name then returns "unknown").
size_t block_elements(tensor_type t);
size_t block_bytes(tensor_type t);

// One metadata value. Scalars live in the union-like fields; arrays hold their elements.
struct value {
  value_type type = value_type::u8;
  uint64_t u = 0;                         // u8..u64 and boolean
  int64_t i = 0;                          // i8..i64
  double f = 0;                           // f32, f64
  std::string_view str;                   // string (points into the mapping)
  value_type elem_type = value_type::u8;  // array element type
  std::vector<value> items;               // array elements
  uint64_t offset = 0;                    // byte offset of the value in the file (for error messages)

  bool is_integer() const;
  // Any integer type as uint64/int64; throws gguf::error when negative or not an integer.
  uint64_t as_uint() const;
  int64_t as_int() const;
  double as_float() const;  // f32/f64, or an integer converted
};

struct tensor_info {
  std::string name;
  std::vector<uint64_t> shape;  // ggml order: shape[0] is the contiguous (row) dimension
  tensor_type type = tensor_type::f32;
  uint64_t offset = 0;  // relative to the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
};

class file {
 public:
  // Maps and parses `path`. Throws gguf::error on any problem.
  static file open(const std::string& path);
  // Parses an in-memory image (used by tests); `image` must outlive the file.
  static file from_memory(const uint8_t* image, size_t size, std::string name = "<memory>");

  file(file&&) noexcept;
  file& operator=(file&&) noexcept;
  ~file();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // The whole image (mapping or from_memory buffer) and where its data section starts:
  // every tensor's data lies in [bytes() + data_offset(), bytes() + size()).
  const uint8_t* bytes() const { return base_; }
  size_t size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }

  // Metadata, in file order.
  const std::vector<std::pair<std::string, value>>& metadata() const { return kv_; }
  const value* find(std::string_view key) const;
  // These throw gguf::error("missing required key ...") when the key is absent, and a type
  // error naming the key when it has the wrong type.
  const value& get(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  uint64_t get_uint(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::vector<std::string_view> get_strings(std::string_view key) const;
  // Optional forms: return `fallback` when the key is absent.
  uint64_t get_uint_or(std::string_view key, uint64_t fallback) const;
  double get_float_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;

  const std::vector<tensor_info>& tensors() const { return tensors_; }
  const tensor_info* find_tensor(std::string_view name) const;
  // Throws when missing, or when its shape differs from `shape` ("shape mismatch").
  const tensor_info& tensor(std::string_view name, const std::vector<uint64_t>& shape) const;

 private:
  file() = default;
  void parse();

  std::string path_;
  struct mapping;
  std::unique_ptr<mapping> map_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, value>> kv_;
  std::vector<tensor_info> tensors_;
};

}  // namespace sy::gguf
