// GGUF reader tests: small images built in memory by a tiny writer, round-tripped, then
// corrupted field by field; plus a check of the real model file when it is present.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/gguf.hpp"
#include "tests/unit/prerequisite.hpp"

using namespace sy::gguf;
using Catch::Matchers::Contains;

namespace {

// Appends little-endian GGUF fields to a byte buffer.
struct writer {
  std::vector<uint8_t> bytes;

  size_t pos() const { return bytes.size(); }
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof v);
  }
  void u32(uint32_t v) { put(v); }
  void u64(uint64_t v) { put(v); }
  void str(std::string_view s) {
    u64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void key(std::string_view k, value_type t) {
    str(k);
    u32(uint32_t(t));
  }
  void array(value_type elem, uint64_t n) {  // header of an array value, elements follow
    u32(uint32_t(elem));
    u64(n);
  }
  void pad(size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
  }
};

template <class T>
void patch(std::vector<uint8_t>& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

struct options {
  uint32_t version = 3;
  bool write_alignment = true;  // false: no general.alignment key, the default 32 applies
  uint32_t alignment = 64;
};

// The valid test image and where the fields the corruption tests patch are.
struct image {
  std::vector<uint8_t> bytes;
  size_t n_tensors_at = 0, n_kv_at = 0;
  size_t first_key_at = 0, first_type_at = 0;  // general.architecture
  size_t alignment_value_at = 0;               // general.alignment's u32
  size_t i8_key_at = 0;                        // length field of key "t.i8"
  size_t strings_elem_at = 0, strings_count_at = 0;
  size_t q8_name_at = 0, q8_ndims_at = 0, q8_dim0_at = 0, q8_type_at = 0, q8_offset_at = 0;
  size_t infos_end = 0, data_offset = 0;
  uint64_t q8_offset = 0, f16_offset = 0;
};

const std::vector<std::string> test_strings = {"a", "", "h\xc3\xa9llo", "<|im_start|>"};

image make_image(const options& o = {}) {
  image img;
  writer w;
  w.bytes = {'G', 'G', 'U', 'F'};
  w.u32(o.version);
  img.n_tensors_at = w.pos();
  w.u64(3);
  img.n_kv_at = w.pos();
  w.u64(0);  // patched below
  uint64_t n_kv = 0;

  img.first_key_at = w.pos();
  w.str("general.architecture");
  img.first_type_at = w.pos();
  w.u32(uint32_t(value_type::string));
  w.str("llama");
  ++n_kv;
  if (o.write_alignment) {
    w.key("general.alignment", value_type::u32);
    img.alignment_value_at = w.pos();
    w.u32(o.alignment);
    ++n_kv;
  }
  w.key("t.u8", value_type::u8), w.put<uint8_t>(200);
  img.i8_key_at = w.pos();
  w.key("t.i8", value_type::i8), w.put<int8_t>(-5);
  w.key("t.u16", value_type::u16), w.put<uint16_t>(60000);
  w.key("t.i16", value_type::i16), w.put<int16_t>(-30000);
  w.key("t.u32", value_type::u32), w.put<uint32_t>(4000000000u);
  w.key("t.i32", value_type::i32), w.put<int32_t>(-2000000000);
  w.key("t.u64", value_type::u64), w.put<uint64_t>((uint64_t{1} << 40) + 3);
  w.key("t.i64", value_type::i64), w.put<int64_t>(-(int64_t{1} << 40));
  w.key("t.f32", value_type::f32), w.put<float>(1.5f);
  w.key("t.f64", value_type::f64), w.put<double>(-3.25);
  w.key("t.true", value_type::boolean), w.put<uint8_t>(1);
  w.key("t.false", value_type::boolean), w.put<uint8_t>(0);
  n_kv += 12;

  w.key("t.strings", value_type::array);
  img.strings_elem_at = w.pos();
  img.strings_count_at = img.strings_elem_at + 4;
  w.array(value_type::string, test_strings.size());
  for (const std::string& s : test_strings) w.str(s);
  // [[1, 2, 3] as i32, [] as u8, ["x"], [[5]] as u16]
  w.key("t.nested", value_type::array);
  w.array(value_type::array, 4);
  w.array(value_type::i32, 3), w.put<int32_t>(1), w.put<int32_t>(2), w.put<int32_t>(3);
  w.array(value_type::u8, 0);
  w.array(value_type::string, 1), w.str("x");
  w.array(value_type::array, 1), w.array(value_type::u16, 1), w.put<uint16_t>(5);
  w.key("t.empty", value_type::array), w.array(value_type::u8, 0);
  w.key("t.i32s", value_type::array), w.array(value_type::i32, 3);
  w.put<int32_t>(-1), w.put<int32_t>(0), w.put<int32_t>(1);
  n_kv += 4;
  patch<uint64_t>(w.bytes, img.n_kv_at, n_kv);

  // Tensors: f32 {3, 2} (24 bytes), q8_0 {64, 2} (4 blocks, 136 bytes), f16 {5} (10 bytes).
  const uint64_t alignment = o.write_alignment ? o.alignment : 32;
  const auto align_up = [&](uint64_t x) { return (x + alignment - 1) / alignment * alignment; };
  img.q8_offset = align_up(24);
  img.f16_offset = align_up(img.q8_offset + 136);
  w.str("f32.weight"), w.u32(2), w.u64(3), w.u64(2), w.u32(0), w.u64(0);
  img.q8_name_at = w.pos();
  w.str("q80.weight");
  img.q8_ndims_at = w.pos();
  w.u32(2);
  img.q8_dim0_at = w.pos();
  w.u64(64), w.u64(2);
  img.q8_type_at = w.pos();
  w.u32(8);
  img.q8_offset_at = w.pos();
  w.u64(img.q8_offset);
  w.str("f16.weight"), w.u32(1), w.u64(5), w.u32(1), w.u64(img.f16_offset);
  img.infos_end = w.pos();

  w.pad(alignment);
  img.data_offset = w.pos();
  for (int k = 0; k < 6; ++k) w.put<float>(float(k));
  w.pad(alignment);
  for (int k = 0; k < 136; ++k) w.put<uint8_t>(uint8_t(k * 7));
  w.pad(alignment);
  for (int k = 0; k < 5; ++k) w.put<uint16_t>(uint16_t(0x3c00 + k));  // no padding after the end
  img.bytes = std::move(w.bytes);
  return img;
}

file parse(const std::vector<uint8_t>& bytes, std::string name = "test.gguf") {
  return file::from_memory(bytes.data(), bytes.size(), std::move(name));
}

// A file holding one key whose value is `depth` arrays nested in each other around one u8.
std::vector<uint8_t> nested_arrays(int depth) {
  writer w;
  w.bytes = {'G', 'G', 'U', 'F'};
  w.u32(3), w.u64(0), w.u64(1);
  w.key("deep", value_type::array);
  for (int d = 1; d < depth; ++d) w.array(value_type::array, 1);
  w.array(value_type::u8, 1), w.put<uint8_t>(42);
  return w.bytes;
}

}  // namespace

TEST_CASE("gguf: every metadata value type round-trips", "[gguf]") {
  const image img = make_image();
  const file f = parse(img.bytes);

  CHECK(f.version() == 3);
  CHECK(f.path() == "test.gguf");
  CHECK(f.alignment() == 64);
  REQUIRE(f.metadata().size() == 18);
  CHECK(f.metadata()[0].first == "general.architecture");
  CHECK(f.metadata()[17].first == "t.i32s");

  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get("general.architecture").offset == img.first_type_at + 4);
  CHECK(f.get_uint("t.u8") == 200);
  CHECK(f.get("t.i8").as_int() == -5);
  CHECK(f.get_uint("t.u16") == 60000);
  CHECK(f.get("t.i16").as_int() == -30000);
  CHECK(f.get_uint("t.u32") == 4000000000u);
  CHECK(f.get("t.i32").as_int() == -2000000000);
  CHECK(f.get_uint("t.u64") == (uint64_t{1} << 40) + 3);
  CHECK(f.get("t.i64").as_int() == -(int64_t{1} << 40));
  CHECK(f.get_float("t.f32") == 1.5);
  CHECK(f.get_float("t.f64") == -3.25);
  CHECK(f.get_bool("t.true"));
  CHECK_FALSE(f.get_bool("t.false"));
  CHECK(f.get("t.u16").type == value_type::u16);
  CHECK(f.get("t.f32").type == value_type::f32);
  CHECK(f.get("t.true").type == value_type::boolean);

  const std::vector<std::string_view> strings = f.get_strings("t.strings");
  REQUIRE(strings.size() == test_strings.size());
  for (size_t k = 0; k < strings.size(); ++k) CHECK(strings[k] == test_strings[k]);

  const value& nested = f.get("t.nested");
  REQUIRE(nested.type == value_type::array);
  REQUIRE(nested.elem_type == value_type::array);
  REQUIRE(nested.items.size() == 4);
  CHECK(nested.items[0].elem_type == value_type::i32);
  REQUIRE(nested.items[0].items.size() == 3);
  CHECK(nested.items[0].items[2].as_int() == 3);
  CHECK(nested.items[1].elem_type == value_type::u8);
  CHECK(nested.items[1].items.empty());
  REQUIRE(nested.items[2].items.size() == 1);
  CHECK(nested.items[2].items[0].str == "x");
  REQUIRE(nested.items[3].items.size() == 1);
  REQUIRE(nested.items[3].items[0].items.size() == 1);
  CHECK(nested.items[3].items[0].items[0].type == value_type::u16);
  CHECK(nested.items[3].items[0].items[0].as_uint() == 5);

  CHECK(f.get("t.empty").elem_type == value_type::u8);
  CHECK(f.get("t.empty").items.empty());
  const value& i32s = f.get("t.i32s");
  REQUIRE(i32s.items.size() == 3);
  CHECK(i32s.items[0].as_int() == -1);
  CHECK(i32s.items[2].as_int() == 1);
}

TEST_CASE("gguf: tensor infos / offsets and data pointers", "[gguf]") {
  const image img = make_image();
  const file f = parse(img.bytes);

  CHECK(f.bytes() == img.bytes.data());
  CHECK(f.size() == img.bytes.size());
  CHECK(f.data_offset() == img.data_offset);
  CHECK(f.data_offset() % 64 == 0);
  REQUIRE(f.tensors().size() == 3);

  const tensor_info& a = f.tensor("f32.weight", {3, 2});
  CHECK(a.type == tensor_type::f32);
  CHECK(a.offset == 0);
  CHECK(a.n_elements == 6);
  CHECK(a.n_bytes == 24);
  CHECK(a.data == img.bytes.data() + img.data_offset);
  for (int k = 0; k < 6; ++k) {
    float v;
    std::memcpy(&v, a.data + 4 * k, 4);
    CHECK(v == float(k));
  }

  const tensor_info& q = f.tensor("q80.weight", {64, 2});
  CHECK(q.type == tensor_type::q8_0);
  CHECK(q.offset == 64);
  CHECK(q.n_elements == 128);
  CHECK(q.n_bytes == 136);
  CHECK(q.data == img.bytes.data() + img.data_offset + 64);
  CHECK(q.data[1] == 7);
  CHECK(q.data[135] == uint8_t(135 * 7));

  const tensor_info* h = f.find_tensor("f16.weight");
  REQUIRE(h != nullptr);
  CHECK(h->shape == std::vector<uint64_t>{5});
  CHECK(h->type == tensor_type::f16);
  CHECK(h->offset == img.f16_offset);
  CHECK(h->n_bytes == 10);
  CHECK(h->data + h->n_bytes == img.bytes.data() + img.bytes.size());  // ends at end of file
  CHECK(f.find_tensor("nope") == nullptr);
}

TEST_CASE("gguf: default alignment / version 2 / block tables", "[gguf]") {
  const image img = make_image({.version = 2, .write_alignment = false});
  const file f = parse(img.bytes);
  CHECK(f.version() == 2);
  CHECK(f.alignment() == 32);
  CHECK(f.data_offset() % 32 == 0);
  CHECK(f.find("general.alignment") == nullptr);
  CHECK(f.tensor("q80.weight", {64, 2}).offset == 32);
  CHECK(f.tensor("f16.weight", {5}).offset == 192);

  CHECK(block_elements(tensor_type::q4_1) == 32);
  CHECK(block_bytes(tensor_type::q4_1) == 20);
  CHECK(block_elements(tensor_type::q6_k) == 256);
  CHECK(block_bytes(tensor_type::q6_k) == 210);
  CHECK(block_bytes(tensor_type::q8_k) == 292);
  CHECK(block_bytes(tensor_type::bf16) == 2);
  CHECK(std::string(type_name(tensor_type::q8_0)) == "q8_0");
  CHECK(std::string(type_name(tensor_type(77))) == "unknown");
  CHECK(block_elements(tensor_type(77)) == 0);
}

TEST_CASE("gguf: typed getters and their errors", "[gguf]") {
  const image img = make_image();
  const file f = parse(img.bytes, "getters.gguf");

  REQUIRE_THROWS_WITH(f.get("t.nope"), Contains("getters.gguf") && Contains("missing required key 't.nope'"));
  REQUIRE_THROWS_WITH(f.get_uint("llama.block_count"), Contains("missing required key 'llama.block_count'"));
  REQUIRE_THROWS_WITH(f.get_string("t.u32"), Contains("getters.gguf") && Contains("byte offset") &&
                                                 Contains("key 't.u32' has type u32; expected string"));
  REQUIRE_THROWS_WITH(f.get_uint("general.architecture"), Contains("has type string; expected an unsigned integer"));
  REQUIRE_THROWS_WITH(f.get_uint("t.i8"), Contains("has type i8; expected a non-negative"));
  REQUIRE_THROWS_WITH(f.get_bool("t.u8"), Contains("has type u8; expected bool"));
  REQUIRE_THROWS_WITH(f.get_float("t.strings"), Contains("has type array of string"));
  REQUIRE_THROWS_WITH(f.get_strings("t.i32s"), Contains("has type array of i32; expected array of string"));
  REQUIRE_THROWS_WITH(f.get_strings("t.u8"), Contains("expected array of string"));

  CHECK(f.get_float("t.u16") == 60000.0);  // integers convert
  CHECK(f.get_uint_or("t.nope", 7) == 7);
  CHECK(f.get_uint_or("t.u8", 7) == 200);
  CHECK(f.get_float_or("t.nope", 0.5) == 0.5);
  CHECK(f.get_bool_or("t.nope", true));
  CHECK_FALSE(f.get_bool_or("t.false", true));
  REQUIRE_THROWS_WITH(f.get_uint_or("general.architecture", 1), Contains("has type string"));

  CHECK(f.get("t.u8").is_integer());
  CHECK_FALSE(f.get("t.f32").is_integer());
  CHECK_FALSE(f.get("t.true").is_integer());
  CHECK(f.get("t.u64").as_int() == int64_t((uint64_t{1} << 40) + 3));
  CHECK(f.get("t.i32").as_float() == -2000000000.0);
  REQUIRE_THROWS_AS(f.get("t.i8").as_uint(), error);
  REQUIRE_THROWS_WITH(f.get("t.f32").as_uint(), Contains("not an integer"));
  REQUIRE_THROWS_WITH(f.get("general.architecture").as_float(), Contains("not a number"));
}

TEST_CASE("gguf: tensor() checks presence and shape", "[gguf]") {
  const image img = make_image();
  const file f = parse(img.bytes, "shapes.gguf");
  REQUIRE_THROWS_WITH(f.tensor("q80.weight", {2, 64}), Contains("shapes.gguf") && Contains("byte offset") &&
                                                           Contains("'q80.weight' shape mismatch") &&
                                                           Contains("expected {2, 64}, found {64, 2}"));
  REQUIRE_THROWS_WITH(f.tensor("f16.weight", {5, 1}), Contains("shape mismatch"));
  REQUIRE_THROWS_WITH(f.tensor("output.weight", {5}), Contains("missing required tensor 'output.weight'"));
}

TEST_CASE("gguf: wrong magic and unsupported versions", "[gguf]") {
  image img = make_image();
  SECTION("wrong magic") {
    img.bytes[3] = 'G';
    REQUIRE_THROWS_WITH(parse(img.bytes, "magic.gguf"), Contains("magic.gguf") && Contains("byte offset 0") &&
                                                            Contains("wrong magic") && Contains("found 47 47 55 47"));
  }
  for (uint32_t version : {0u, 1u, 4u, 99u, 0x03000000u}) {
    DYNAMIC_SECTION("version " << version) {
      patch<uint32_t>(img.bytes, 4, version);
      REQUIRE_THROWS_WITH(parse(img.bytes, "version.gguf"),
                          Contains("version.gguf") && Contains("byte offset 4") &&
                              Contains("unsupported version " + std::to_string(version)) &&
                              Contains("expected 2 or 3"));
    }
  }
}

TEST_CASE("gguf: every truncated prefix throws", "[gguf]") {
  const image img = make_image();
  REQUIRE(img.bytes.size() > 400);
  for (size_t n = 0; n < img.bytes.size(); ++n) {
    // An exact-size heap copy, so a sanitizer build catches any read past the end.
    const std::vector<uint8_t> prefix(img.bytes.begin(), img.bytes.begin() + n);
    const std::string expected = n < img.infos_end ? "truncated" : "tensor data past end of file";
    INFO("prefix of " << n << " bytes");
    REQUIRE_THROWS_WITH(parse(prefix, "cut.gguf"),
                        Contains("cut.gguf") && Contains("byte offset") && Contains(expected));
  }
  REQUIRE_NOTHROW(parse(img.bytes));
}

TEST_CASE("gguf: corrupt fields are reported", "[gguf]") {
  image img = make_image();
  std::vector<uint8_t>& b = img.bytes;
  const auto fails_with = [&](const std::string& words) {
    REQUIRE_THROWS_WITH(parse(b, "bad.gguf"), Contains("bad.gguf") && Contains("byte offset") && Contains(words));
  };

  SECTION("tensor data past end of file") {
    patch<uint64_t>(b, img.q8_offset_at, 64 * 1000);
    fails_with("'q80.weight': tensor data past end of file");
  }
  SECTION("data offset not a multiple of the alignment") {
    patch<uint64_t>(b, img.q8_offset_at, 32);
    fails_with("data offset 32 is not a multiple of the alignment 64");
  }
  SECTION("unknown tensor type") {
    patch<uint32_t>(b, img.q8_type_at, 77);
    fails_with("unknown tensor type 77");
  }
  SECTION("unknown metadata value type") {
    patch<uint32_t>(b, img.first_type_at, 13);
    fails_with("byte offset " + std::to_string(img.first_type_at));
    fails_with("'general.architecture': unknown metadata value type 13");
  }
  SECTION("unknown array element type") {
    patch<uint32_t>(b, img.strings_elem_at, 42);
    fails_with("unknown metadata value type 42");
  }
  SECTION("n_dims above 4 or zero") {
    patch<uint32_t>(b, img.q8_ndims_at, 5);
    fails_with("n_dims is 5; expected 1 to 4");
    patch<uint32_t>(b, img.q8_ndims_at, 0);
    fails_with("n_dims is 0");
  }
  SECTION("row length not a whole number of blocks") {
    patch<uint64_t>(b, img.q8_dim0_at, 40);
    fails_with("row length 40 is not a multiple of the q8_0 block size 32");
  }
  SECTION("element count overflow") {
    patch<uint64_t>(b, img.q8_dim0_at, uint64_t{1} << 40);
    patch<uint64_t>(b, img.q8_dim0_at + 8, uint64_t{1} << 40);
    fails_with("overflows the element count");
    patch<uint64_t>(b, img.q8_dim0_at, ~uint64_t{0});
    fails_with("overflows the element count");
  }
  SECTION("absurd string length does not allocate") {
    patch<uint64_t>(b, img.first_key_at, uint64_t{1} << 62);
    fails_with("truncated file: expected metadata key of 4611686018427387904 bytes");
  }
  SECTION("absurd array count does not allocate") {
    patch<uint64_t>(b, img.strings_count_at, uint64_t{1} << 60);
    fails_with("corrupt count");
    patch<uint64_t>(b, img.strings_count_at, ~uint64_t{0});
    fails_with("array elements need at least 8 bytes each");
  }
  SECTION("absurd metadata and tensor counts") {
    patch<uint64_t>(b, img.n_kv_at, ~uint64_t{0});
    fails_with("metadata key/value pairs");
    patch<uint64_t>(b, img.n_kv_at, 18);
    patch<uint64_t>(b, img.n_tensors_at, uint64_t{1} << 50);
    fails_with("tensor infos need at least 24 bytes each");
  }
  SECTION("duplicate key") {
    b[img.i8_key_at + 8 + 2] = 'u';  // "t.i8" -> "t.u8"
    fails_with("duplicate metadata key 't.u8'");
  }
  SECTION("duplicate tensor name") {
    std::memcpy(b.data() + img.q8_name_at + 8, "f32", 3);  // "q80.weight" -> "f32.weight"
    fails_with("duplicate tensor name 'f32.weight'");
  }
  SECTION("alignment must be a power of two") {
    for (uint32_t alignment : {0u, 48u}) {
      const image odd = make_image({.alignment = alignment == 0 ? 64 : alignment});
      b = odd.bytes;
      if (alignment == 0) patch<uint32_t>(b, odd.alignment_value_at, 0);
      fails_with("general.alignment is " + std::to_string(alignment) + "; expected a power of two");
    }
  }
}

TEST_CASE("gguf: nested arrays are bounded in depth", "[gguf]") {
  const file ok = parse(nested_arrays(8));
  const value* v = &ok.get("deep");
  for (int d = 1; d < 8; ++d) v = &v->items.at(0);
  CHECK(v->items.at(0).as_uint() == 42);
  REQUIRE_THROWS_WITH(parse(nested_arrays(9), "deep.gguf"), Contains("deep.gguf") && Contains("nested deeper than 8"));
  REQUIRE_THROWS_WITH(parse(nested_arrays(100000)), Contains("nested deeper"));
}

TEST_CASE("gguf: random corruption throws gguf::error or parses", "[gguf]") {
  const image img = make_image();
  std::mt19937 rng(1234);
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> b = img.bytes;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % img.infos_end;  // the structure, not the tensor payload
      b[at] = rng() % 3 == 0 ? uint8_t(0xff) : uint8_t(rng());
    }
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    try {
      const file f = parse(b);
      for (const tensor_info& t : f.tensors()) REQUIRE(t.data + t.n_bytes <= f.bytes() + f.size());
      ++parsed;
    } catch (const error&) {
      ++rejected;
    }
  }
  CHECK(parsed + rejected == 3000);
  CHECK(rejected > 0);
}

TEST_CASE("gguf: open() maps a file from disk", "[gguf]") {
  const image img = make_image();
  char path[] = "/tmp/test_gguf_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, img.bytes.data(), img.bytes.size()) == ssize_t(img.bytes.size()));
  ::close(fd);

  {
    file f = file::open(path);
    CHECK(f.path() == path);
    CHECK(f.size() == img.bytes.size());
    CHECK(f.get_string("general.architecture") == "llama");
    const file moved = std::move(f);  // data pointers follow the mapping, not the object
    const tensor_info& q = moved.tensor("q80.weight", {64, 2});
    CHECK(q.data == moved.bytes() + img.data_offset + 64);
    CHECK(q.data[135] == uint8_t(135 * 7));
  }

  REQUIRE(::truncate(path, 100) == 0);
  REQUIRE_THROWS_WITH(file::open(path), Contains(path) && Contains("truncated"));
  REQUIRE(::truncate(path, 0) == 0);
  REQUIRE_THROWS_WITH(file::open(path), Contains("truncated file: expected magic"));
  ::unlink(path);
  REQUIRE_THROWS_WITH(file::open(path), Contains(path) && Contains("cannot open"));
  REQUIRE_THROWS_WITH(file::open("/tmp"), Contains("not a regular file"));
}

TEST_CASE("gguf: real model file", "[gguf][model]") {
  SY_REQUIRE_MODEL_FILE();
  const file f = file::open(sy::test::model_path());
  CHECK(f.version() == 3);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_uint("llama.block_count") == 30);
  CHECK(f.tensors().size() == 272);

  const tensor_info& embd = f.tensor("token_embd.weight", {576, 49152});
  CHECK(embd.type == tensor_type::q8_0);
  CHECK(embd.n_bytes == 576 * 49152 / 32 * 34);
  const tensor_info* q = f.find_tensor("blk.0.attn_q.weight");
  REQUIRE(q != nullptr);
  CHECK(q->type == tensor_type::q4_1);
  CHECK(f.get_strings("tokenizer.ggml.tokens").size() == 49152);

  uint64_t total = 0;
  for (const tensor_info& t : f.tensors()) {
    INFO(t.name);
    REQUIRE(t.data >= f.bytes() + f.data_offset());
    REQUIRE(t.data + t.n_bytes <= f.bytes() + f.size());
    REQUIRE(t.offset % f.alignment() == 0);
    total += t.n_bytes;
  }
  CHECK(total <= f.size() - f.data_offset());
}
