// GGUF v2/v3 reader. File layout, all little-endian:
//   header    "GGUF", u32 version, u64 tensor_count, u64 kv_count
//   metadata  kv_count × (string key, u32 value_type, value)
//   infos     tensor_count × (string name, u32 n_dims, n_dims × u64 dim, u32 type, u64 offset)
//   padding   up to a multiple of `general.alignment` (default 32); the data section starts there
// A gguf string is a u64 byte length followed by the bytes (no terminator); an array is a u32
// element type, a u64 count and the elements.
//
// Every read goes through `reader`, which checks the remaining length before touching memory
// (memcpy, so unaligned fields are fine), and every count is checked against the remaining
// bytes before anything is reserved for it: no input reads out of bounds or allocates more than
// a small multiple of the file's size.
#include "common/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>
#include <unordered_set>

namespace sy::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes little-endian");

namespace {

constexpr uint32_t max_dims = 4;
constexpr unsigned max_array_depth = 8;
// Array elements across all metadata. Each costs sizeof(value) (~90 bytes) of heap, far more
// than its bytes in the file, so a corrupt count that still fits the file is capped here
// (~1.5 GiB). Real vocabularies hold a few hundred thousand entries.
constexpr uint64_t max_array_elements = uint64_t{1} << 24;
constexpr uint64_t max_dim = uint64_t(std::numeric_limits<int64_t>::max());  // ggml's int64
// Smallest encodings, for checking counts before reserving: key length + type + 1-byte value;
// name length + n_dims + type + offset (n_dims >= 1 adds 8 more, not counted).
constexpr uint64_t min_kv_bytes = 8 + 4 + 1;
constexpr uint64_t min_tensor_info_bytes = 8 + 4 + 4 + 8;

struct block_layout {
  const char* name;  // nullptr for an unknown id
  size_t elements;
  size_t bytes;
};

constexpr block_layout layout_of(tensor_type t) {
  switch (t) {
    case tensor_type::f32:
      return {"f32", 1, 4};
    case tensor_type::f16:
      return {"f16", 1, 2};
    case tensor_type::bf16:
      return {"bf16", 1, 2};
    case tensor_type::q4_0:
      return {"q4_0", 32, 18};
    case tensor_type::q4_1:
      return {"q4_1", 32, 20};
    case tensor_type::q5_0:
      return {"q5_0", 32, 22};
    case tensor_type::q5_1:
      return {"q5_1", 32, 24};
    case tensor_type::q8_0:
      return {"q8_0", 32, 34};
    case tensor_type::q8_1:
      return {"q8_1", 32, 36};
    case tensor_type::q2_k:
      return {"q2_K", 256, 84};
    case tensor_type::q3_k:
      return {"q3_K", 256, 110};
    case tensor_type::q4_k:
      return {"q4_K", 256, 144};
    case tensor_type::q5_k:
      return {"q5_K", 256, 176};
    case tensor_type::q6_k:
      return {"q6_K", 256, 210};
    case tensor_type::q8_k:
      return {"q8_K", 256, 292};
  }
  return {nullptr, 0, 0};
}

constexpr const char* known_tensor_types =
    "f32 (0), f16 (1), q4_0 (2), q4_1 (3), q5_0 (6), q5_1 (7), q8_0 (8), q8_1 (9), q2_k (10), "
    "q3_k (11), q4_k (12), q5_k (13), q6_k (14), q8_k (15) or bf16 (30)";

bool known_value_type(uint32_t t) { return t <= uint32_t(value_type::f64); }

const char* value_type_name(value_type t) {
  static constexpr const char* names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                          "bool", "string", "array", "u64", "i64", "f64"};
  return known_value_type(uint32_t(t)) ? names[uint32_t(t)] : "unknown";
}

// Bytes the smallest value of type `t` occupies (arrays: element type + count).
uint64_t min_value_bytes(value_type t) {
  switch (t) {
    case value_type::u8:
    case value_type::i8:
    case value_type::boolean:
      return 1;
    case value_type::u16:
    case value_type::i16:
      return 2;
    case value_type::u32:
    case value_type::i32:
    case value_type::f32:
      return 4;
    case value_type::array:
      return 12;
    default:
      return 8;  // u64, i64, f64, string length
  }
}

bool is_signed(value_type t) {
  return t == value_type::i8 || t == value_type::i16 || t == value_type::i32 || t == value_type::i64;
}
bool is_unsigned(value_type t) {
  return t == value_type::u8 || t == value_type::u16 || t == value_type::u32 || t == value_type::u64;
}

// Names and keys come from the file: quote them, escape non-printable bytes, clip long ones.
std::string quoted(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 96; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 96) out += "...";
  return out + "'";
}

std::string where(const std::string& path, uint64_t at) {
  return "gguf: " + path + ": at byte offset " + std::to_string(at) + ": ";
}

// value:: methods do not know the file; their messages name only the offset.
std::string value_where(uint64_t at) { return "gguf: value at byte offset " + std::to_string(at) + ": "; }

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string out = "{";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "}";
}

// Bounds-checked cursor over the image. `pos_ <= size_` always holds.
class reader {
 public:
  reader(const uint8_t* base, size_t size, const std::string& path) : base_(base), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(uint64_t at, const std::string& what) const { throw error(where(path_, at) + what); }

  // `prefix` + `what` names the field in the message ("length of " + "tensor name").
  void need(uint64_t n, const char* what, const char* prefix = "") const {
    if (n > remaining())
      fail(pos_, std::string("truncated file: expected ") + prefix + what + " (" + std::to_string(n) +
                     " bytes), only " + std::to_string(remaining()) + " bytes remain");
  }

  // `count` items of at least `min_each` bytes must fit in what is left.
  void check_count(uint64_t at, uint64_t count, uint64_t min_each, const char* what) const {
    if (count > remaining() / min_each)
      fail(at, "truncated file or corrupt count: " + std::to_string(count) + " " + what + " need at least " +
                   std::to_string(min_each) + " bytes each, only " + std::to_string(remaining()) + " bytes remain");
  }

  template <class T>
  T scalar(const char* what, const char* prefix = "") {
    need(sizeof(T), what, prefix);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string_view string(const char* what) {
    const uint64_t at = pos_;
    const uint64_t n = scalar<uint64_t>(what, "length of ");
    if (n > remaining())
      fail(at, std::string("truncated file: expected ") + what + " of " + std::to_string(n) + " bytes, only " +
                   std::to_string(remaining()) + " bytes remain");
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }

  value read_value(value_type type, unsigned depth) {
    value v;
    v.type = type;
    v.offset = pos_;
    switch (type) {
      case value_type::u8:
        v.u = scalar<uint8_t>("u8 value");
        break;
      case value_type::i8:
        v.i = scalar<int8_t>("i8 value");
        break;
      case value_type::u16:
        v.u = scalar<uint16_t>("u16 value");
        break;
      case value_type::i16:
        v.i = scalar<int16_t>("i16 value");
        break;
      case value_type::u32:
        v.u = scalar<uint32_t>("u32 value");
        break;
      case value_type::i32:
        v.i = scalar<int32_t>("i32 value");
        break;
      case value_type::u64:
        v.u = scalar<uint64_t>("u64 value");
        break;
      case value_type::i64:
        v.i = scalar<int64_t>("i64 value");
        break;
      case value_type::f32:
        v.f = scalar<float>("f32 value");
        break;
      case value_type::f64:
        v.f = scalar<double>("f64 value");
        break;
      case value_type::boolean:
        v.u = scalar<uint8_t>("bool value") != 0;
        break;
      case value_type::string:
        v.str = string("string value");
        break;
      case value_type::array:
        read_array(v, depth);
        break;
    }
    return v;
  }

 private:
  void read_array(value& v, unsigned depth) {
    if (depth >= max_array_depth)
      fail(pos_, "arrays nested deeper than " + std::to_string(max_array_depth) + " levels; expected at most that");
    const uint64_t type_at = pos_;
    const uint32_t elem = scalar<uint32_t>("array element type");
    if (!known_value_type(elem))
      fail(type_at, "unknown metadata value type " + std::to_string(elem) + " for array elements; expected 0..12");
    v.elem_type = value_type(elem);
    const uint64_t count_at = pos_;
    const uint64_t count = scalar<uint64_t>("array length");
    check_count(count_at, count, min_value_bytes(v.elem_type), "array elements");
    if (count > max_array_elements - array_elements_)
      fail(count_at, "array of " + std::to_string(count) + " elements; expected at most " +
                         std::to_string(max_array_elements) + " array elements in all metadata");
    array_elements_ += count;
    v.items.reserve(count);
    for (uint64_t k = 0; k < count; ++k) v.items.push_back(read_value(v.elem_type, depth + 1));
  }

  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t array_elements_ = 0;  // running total, bounded by max_array_elements
  const std::string& path_;
};

}  // namespace

const char* type_name(tensor_type t) {
  const char* name = layout_of(t).name;
  return name ? name : "unknown";
}
size_t block_elements(tensor_type t) { return layout_of(t).elements; }
size_t block_bytes(tensor_type t) { return layout_of(t).bytes; }

// ---- value ------------------------------------------------------------------------------------

bool value::is_integer() const { return is_signed(type) || is_unsigned(type); }

uint64_t value::as_uint() const {
  if (is_unsigned(type)) return u;
  if (is_signed(type) && i >= 0) return uint64_t(i);
  throw error(value_where(offset) + value_type_name(type) +
              (is_signed(type) ? " value is negative" : " value is not an integer") + "; expected an unsigned integer");
}

int64_t value::as_int() const {
  if (is_signed(type)) return i;
  if (is_unsigned(type) && u <= max_dim) return int64_t(u);
  throw error(value_where(offset) + value_type_name(type) +
              (is_unsigned(type) ? " value exceeds int64" : " value is not an integer") +
              "; expected a signed integer");
}

double value::as_float() const {
  if (type == value_type::f32 || type == value_type::f64) return f;
  if (is_signed(type)) return double(i);
  if (is_unsigned(type)) return double(u);
  throw error(value_where(offset) + value_type_name(type) + " value is not a number; expected a float or an integer");
}

// ---- file -------------------------------------------------------------------------------------

// Owns the read-only mapping; tensor data and string views point into it.
struct file::mapping {
  void* addr = nullptr;
  size_t len = 0;
  ~mapping() {
    if (addr) ::munmap(addr, len);
  }
};

file::file(file&&) noexcept = default;
file& file::operator=(file&&) noexcept = default;
file::~file() = default;

file file::open(const std::string& path) {
  struct fd_guard {
    int fd;
    ~fd_guard() {
      if (fd >= 0) ::close(fd);
    }
  } fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  const auto sys_error = [&](const char* what) {
    return error("gguf: " + path + ": " + what + ": " + std::generic_category().message(errno));
  };
  if (fd.fd < 0) throw sys_error("cannot open");
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw sys_error("cannot stat");
  if (!S_ISREG(st.st_mode)) throw error("gguf: " + path + ": not a regular file");

  file f;
  f.path_ = path;
  f.map_ = std::make_unique<mapping>();
  f.size_ = size_t(st.st_size);
  if (f.size_ > 0) {  // mmap rejects length 0; an empty file fails parsing as truncated
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (p == MAP_FAILED) throw sys_error("cannot mmap");
    f.map_->addr = p;
    f.map_->len = f.size_;
    f.base_ = static_cast<const uint8_t*>(p);
  }
  f.parse();
  return f;
}

file file::from_memory(const uint8_t* image, size_t size, std::string name) {
  file f;
  f.path_ = std::move(name);
  f.base_ = image;
  f.size_ = size;
  f.parse();
  return f;
}

void file::parse() {
  reader r(base_, size_, path_);

  const uint32_t magic = r.scalar<uint32_t>("magic \"GGUF\"");
  if (std::memcmp(&magic, "GGUF", 4) != 0) {
    char found[32];
    std::snprintf(found, sizeof found, "%02x %02x %02x %02x", magic & 0xff, (magic >> 8) & 0xff, (magic >> 16) & 0xff,
                  magic >> 24);
    r.fail(0, std::string("wrong magic: expected \"GGUF\" (47 47 55 46), found ") + found);
  }
  version_ = r.scalar<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    r.fail(4, "unsupported version " + std::to_string(version_) + "; expected 2 or 3");
  const uint64_t n_tensors_at = r.pos();
  const uint64_t n_tensors = r.scalar<uint64_t>("tensor count");
  const uint64_t n_kv_at = r.pos();
  const uint64_t n_kv = r.scalar<uint64_t>("metadata key/value count");

  // Metadata. Keys and names are checked for duplicates through views into the image.
  r.check_count(n_kv_at, n_kv, min_kv_bytes, "metadata key/value pairs");
  kv_.reserve(n_kv);
  std::unordered_set<std::string_view> seen;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = r.pos();
    const std::string_view key = r.string("metadata key");
    if (!seen.insert(key).second) r.fail(at, "duplicate metadata key " + quoted(key) + "; expected each key once");
    const uint64_t type_at = r.pos();
    const uint32_t type = r.scalar<uint32_t>("metadata value type");
    if (!known_value_type(type))
      r.fail(type_at,
             "key " + quoted(key) + ": unknown metadata value type " + std::to_string(type) + "; expected 0..12");
    kv_.emplace_back(std::string(key), r.read_value(value_type(type), 0));
  }

  if (const value* a = find("general.alignment")) {
    alignment_ = get_uint("general.alignment");
    if (!std::has_single_bit(alignment_))
      r.fail(a->offset, "general.alignment is " + std::to_string(alignment_) + "; expected a power of two");
  }

  // Tensor infos. `info_at[i]` is where tensor i's info starts, for later messages.
  r.check_count(n_tensors_at, n_tensors, min_tensor_info_bytes, "tensor infos");
  tensors_.reserve(n_tensors);
  std::vector<uint64_t> info_at;
  info_at.reserve(n_tensors);
  seen.clear();
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const uint64_t at = r.pos();
    tensor_info t;
    const std::string_view name = r.string("tensor name");
    if (!seen.insert(name).second) r.fail(at, "duplicate tensor name " + quoted(name) + "; expected each name once");
    t.name = std::string(name);
    const std::string what = "tensor " + quoted(name) + ": ";

    const uint64_t dims_at = r.pos();
    const uint32_t n_dims = r.scalar<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > max_dims)
      r.fail(dims_at, what + "n_dims is " + std::to_string(n_dims) + "; expected 1 to " + std::to_string(max_dims));
    t.shape.resize(n_dims);
    t.n_elements = 1;
    for (uint64_t& dim : t.shape) {
      const uint64_t dim_at = r.pos();
      dim = r.scalar<uint64_t>("tensor dimension");
      if (dim > max_dim || __builtin_mul_overflow(t.n_elements, dim, &t.n_elements) || t.n_elements > max_dim)
        r.fail(dim_at, what + "dimension " + std::to_string(dim) +
                           " overflows the element count; expected at most 2^63-1 elements");
    }

    const uint64_t type_at = r.pos();
    const uint32_t type = r.scalar<uint32_t>("tensor type");
    const block_layout layout = layout_of(tensor_type(type));
    if (!layout.name)
      r.fail(type_at, what + "unknown tensor type " + std::to_string(type) + "; expected " + known_tensor_types);
    t.type = tensor_type(type);
    if (t.shape[0] % layout.elements != 0)
      r.fail(dims_at, what + "row length " + std::to_string(t.shape[0]) + " is not a multiple of the " + layout.name +
                          " block size " + std::to_string(layout.elements) + "; expected a whole number of blocks");
    if (__builtin_mul_overflow(t.n_elements / layout.elements, layout.bytes, &t.n_bytes))
      r.fail(dims_at, what + "byte size overflows; expected a tensor smaller than 2^64 bytes");

    const uint64_t offset_at = r.pos();
    t.offset = r.scalar<uint64_t>("tensor data offset");
    if (t.offset % alignment_ != 0)
      r.fail(offset_at, what + "data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                            std::to_string(alignment_));
    tensors_.push_back(std::move(t));
    info_at.push_back(at);
  }

  // The data section starts at the first aligned offset after the infos; the file may end
  // before it when there is no tensor data.
  const uint64_t infos_end = r.pos();
  const uint64_t pad = (alignment_ - infos_end % alignment_) % alignment_;
  if (__builtin_add_overflow(infos_end, pad, &data_offset_))
    r.fail(infos_end, "data section offset overflows; expected a smaller general.alignment");
  for (size_t k = 0; k < tensors_.size(); ++k) {
    tensor_info& t = tensors_[k];
    if (data_offset_ > size_ || t.offset > size_ - data_offset_ || t.n_bytes > size_ - data_offset_ - t.offset)
      r.fail(info_at[k], "tensor " + quoted(t.name) + ": tensor data past end of file: " + std::to_string(t.n_bytes) +
                             " bytes at data offset " + std::to_string(t.offset) + " (data section at byte " +
                             std::to_string(data_offset_) + "); expected them to end within the " +
                             std::to_string(size_) + "-byte file");
    t.data = base_ + data_offset_ + t.offset;
  }
}

// ---- lookups ----------------------------------------------------------------------------------

const value* file::find(std::string_view key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return &v;
  return nullptr;
}

const value& file::get(std::string_view key) const {
  if (const value* v = find(key)) return *v;
  throw error("gguf: " + path_ + ": missing required key " + quoted(key) + " (file has " + std::to_string(kv_.size()) +
              " metadata keys)");
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const value& v, const char* expected) {
  std::string found = value_type_name(v.type);
  if (v.type == value_type::array) found += std::string(" of ") + value_type_name(v.elem_type);
  throw error(where(path, v.offset) + "key " + quoted(key) + " has type " + found + "; expected " + expected);
}
}  // namespace

std::string file::get_string(std::string_view key) const {
  const value& v = get(key);
  if (v.type != value_type::string) wrong_type(path_, key, v, "string");
  return std::string(v.str);
}

uint64_t file::get_uint(std::string_view key) const {
  const value& v = get(key);
  if (is_unsigned(v.type)) return v.u;
  if (is_signed(v.type) && v.i >= 0) return uint64_t(v.i);
  wrong_type(path_, key, v, is_signed(v.type) ? "a non-negative integer" : "an unsigned integer");
}

double file::get_float(std::string_view key) const {
  const value& v = get(key);
  if (v.type == value_type::boolean || v.type == value_type::string || v.type == value_type::array)
    wrong_type(path_, key, v, "a float");
  return v.as_float();
}

bool file::get_bool(std::string_view key) const {
  const value& v = get(key);
  if (v.type != value_type::boolean) wrong_type(path_, key, v, "bool");
  return v.u != 0;
}

std::vector<std::string_view> file::get_strings(std::string_view key) const {
  const value& v = get(key);
  if (v.type != value_type::array || v.elem_type != value_type::string) wrong_type(path_, key, v, "array of string");
  std::vector<std::string_view> out;
  out.reserve(v.items.size());
  for (const value& item : v.items) out.push_back(item.str);
  return out;
}

uint64_t file::get_uint_or(std::string_view key, uint64_t fallback) const {
  return find(key) ? get_uint(key) : fallback;
}
double file::get_float_or(std::string_view key, double fallback) const { return find(key) ? get_float(key) : fallback; }
bool file::get_bool_or(std::string_view key, bool fallback) const { return find(key) ? get_bool(key) : fallback; }

const tensor_info* file::find_tensor(std::string_view name) const {
  for (const tensor_info& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const tensor_info& file::tensor(std::string_view name, const std::vector<uint64_t>& shape) const {
  const tensor_info* t = find_tensor(name);
  if (!t)
    throw error("gguf: " + path_ + ": missing required tensor " + quoted(name) + " (file has " +
                std::to_string(tensors_.size()) + " tensors)");
  if (t->shape != shape)
    throw error(where(path_, data_offset_ + t->offset) + "tensor " + quoted(name) + " shape mismatch: expected " +
                shape_string(shape) + ", found " + shape_string(t->shape));
  return *t;
}

}  // namespace sy::gguf
