#include "worker/cli/tokenizer_export.hpp"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/gguf.hpp"
#include "common/tokenizer/chat_template.hpp"
#include "common/tokenizer/hf_tokenizer.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "common/wire/protocol.hpp"

namespace sy {

void export_hf_tokenizer(const gguf::file& f, const chat_template& tmpl, int64_t max_context, const std::string& dir) {
  const hf_tokenizer_files files =
      make_hf_tokenizer_files(tokenizer::spec_from_gguf(f), tokenizer::from_gguf(f), tmpl, max_context);
  std::filesystem::create_directories(dir);
  for (const std::string_view name : k_hf_tokenizer_file_names) {
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    std::ofstream out(p, std::ios::binary);
    out << *files.find(name);
    if (!out) throw std::runtime_error("export-tokenizer: cannot write " + p.string());
  }
}

}  // namespace sy
