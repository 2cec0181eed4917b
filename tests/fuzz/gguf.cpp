// Fuzzes the GGUF reader (common/gguf.hpp) on in-memory images (file::from_memory, the same
// parse() a mapped file goes through), then what the worker reads from a model file before any
// weight: the tokenizer metadata (tokenizer::from_gguf, tokenizer::spec_from_gguf). A bad image
// must be refused with gguf::error (or, for unusable tokenizer metadata, std::runtime_error),
// never read out of bounds; a tensor the reader accepts lies inside the image.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <vector>

#include "common/gguf.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "common/wire/protocol.hpp"

namespace gguf = sy::gguf;

namespace {

void touch(const gguf::value& v) {
  if (v.is_integer()) {
    try {
      (void)v.as_uint();
    } catch (const gguf::error&) {  // negative
    }
  }
  for (const gguf::value& item : v.items) touch(item);
}

void check_tensors(const gguf::file& f) {
  const uint8_t* begin = f.bytes() + f.data_offset();
  const uint8_t* end = f.bytes() + f.size();
  for (const gguf::tensor_info& t : f.tensors()) {
    if (t.data < begin || t.data > end || t.n_bytes > uint64_t(end - t.data)) std::abort();
    if (f.find_tensor(t.name) == nullptr) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so ASan sees any read past the image.
  const std::vector<uint8_t> image(data, data + size);
  try {
    const gguf::file f = gguf::file::from_memory(image.data(), image.size(), "fuzz.gguf");
    for (const auto& [key, v] : f.metadata()) {
      touch(v);
      if (f.find(key) == nullptr) std::abort();
    }
    check_tensors(f);
    try {
      (void)sy::tokenizer::spec_from_gguf(f);
      const sy::tokenizer tok = sy::tokenizer::from_gguf(f);
      const std::vector<sy::token_id> ids = tok.encode("Hello, world! <|im_start|>user");
      (void)tok.decode(ids, true);
    } catch (const std::runtime_error&) {  // unusable tokenizer metadata (gguf::error is one too)
    }
  } catch (const gguf::error&) {
  }
  return 0;
}
