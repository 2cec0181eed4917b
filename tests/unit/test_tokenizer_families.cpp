// Tokenizers of the generated test models (tests/tools/make_test_models.py: Llama 3, Qwen2/3
// byte-level BPE, Mistral and Gemma 3 SentencePiece vocabularies), and of the real model files
// (SY_TEST_MODELS_DIR, tests/tools/real_models.sh), against llama.cpp's own output, recorded by
// tests/tools/llamacpp_ref_tokens.py as <model>.tokens.json next to each family's f16 file.
// Skips (with a warning) when the models have not been made (tests/tools/test_models.sh).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf.hpp"
#include "common/tokenizer/stream_decoder.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "common/wire/protocol.hpp"
#include "tests/unit/prerequisite.hpp"
#include "worker/service/worker_service.hpp"

#ifndef SY_TEST_MODELS_DIR
#define SY_TEST_MODELS_DIR "build/test-models"
#endif

using sy::token_id;
using sy::tokenizer;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct model_file {
  std::string family, type;
  fs::path path;
};

// One family's f16 model, its tokenizer and llama.cpp's reference.
struct family_ref {
  std::string family;
  fs::path path;
  tokenizer tok;
  json ref;
};

struct test_models {
  std::vector<model_file> files;
  std::vector<family_ref> families;  // sorted by name
};

// SY_TEST_MODELS_DIR from the environment (the real-model run, tests/tools/real_models.sh), else
// the generated models.
const char* env_models_dir() {
  const char* env = std::getenv("SY_TEST_MODELS_DIR");
  return env && *env ? env : nullptr;
}

const test_models* models() {
  static const std::unique_ptr<test_models> m = []() -> std::unique_ptr<test_models> {
    const fs::path dir = env_models_dir() ? env_models_dir() : SY_TEST_MODELS_DIR;
    std::ifstream in(dir / "manifest.json");
    if (!in.good()) return nullptr;
    auto out = std::make_unique<test_models>();
    std::map<std::string, fs::path> f16;
    const json manifest = json::parse(in);
    for (const json& e : manifest.at("models")) {
      const bool real = e.value("shape", "tiny") == "real";
      if (e.value("shape", "tiny") != "tiny" && !real) continue;
      out->files.push_back({e.at("family"), e.at("type"), dir / e.at("path").get<std::string>()});
      // Each family's reference file: the generated f16 one, or a real model's own.
      if (out->files.back().type == "f16" || real) f16.emplace(out->files.back().family, out->files.back().path);
    }
    for (const auto& [family, path] : f16) {
      fs::path ref_path = path;
      ref_path.replace_extension(".tokens.json");
      std::ifstream rin(ref_path);
      if (!rin.good()) throw std::runtime_error("no llama.cpp reference " + ref_path.string());
      out->families.push_back(
          {family, path, tokenizer::from_gguf(sy::gguf::file::open(path.string())), json::parse(rin)});
    }
    return out;
  }();
  return m.get();
}

#define SY_REQUIRE_TEST_MODELS(var)  \
  const test_models* var = models(); \
  if (var == nullptr) SY_SKIP_TEST("no " SY_TEST_MODELS_DIR "/manifest.json (tests/tools/test_models.sh)")

std::vector<token_id> ids_of(const json& a) { return a.get<std::vector<token_id>>(); }

std::string stream_decode(const tokenizer& tok, const std::vector<token_id>& ids, bool render_special) {
  sy::stream_decoder dec(tok, render_special);
  std::string out;
  for (const token_id id : ids) out += dec.push(id);
  return out + dec.flush();
}

// llama_detokenize(remove_special = false, unparse_special = false), modelled on our decode:
// it also drops the first token's leading space when the vocabulary adds a space prefix, and
// with `clean_spaces` (llama.cpp's clean_up_tokenization_spaces, set for llama-bpe and gpt-2,
// not for qwen2, smollm or SentencePiece) removes the space before ? ! . , and in " ' ", " 's",
// " 'm", " 're", " 've". decode() does neither: see tokenizer.hpp.
std::string llama_detokenize_like(const tokenizer& tok, const std::vector<token_id>& ids, bool clean_spaces) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = tok.token_bytes(ids[i]);
    if (i == 0 && tok.add_space_prefix() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    s += piece;
  }
  if (!clean_spaces || s.empty()) return s;
  // Each pass reads the previous pass's characters; a space it drops is the one just written.
  std::string a(1, s[0]);
  for (size_t i = 1; i < s.size(); ++i) {
    const char x = s[i];
    if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) a.pop_back();
    a += x;
  }
  std::string b(1, a[0]);
  char prev = a[0];  // what llama.cpp sees before position i (a skipped space reads as NUL)
  for (size_t i = 1; i < a.size(); ++i) {
    const char x = a[i];
    if (x == '\'' && i + 1 < a.size() && prev == ' ' && a[i + 1] == ' ') {
      b.pop_back();
      b += x;
      ++i;
      prev = '\0';
      continue;
    }
    b += x;
    prev = x;
  }
  std::string c(1, b[0]);
  for (size_t i = 1; i < b.size(); ++i) {
    const char x = b[i];
    if (b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      const char x2 = i + 2 < b.size() ? b[i + 2] : '\0';
      if (x1 == 's' || x1 == 'm' || (x2 == 'e' && (x1 == 'r' || x1 == 'v'))) c.pop_back();
    }
    c += x;
  }
  return c;
}

}  // namespace

TEST_CASE("tokenizer families: every case encodes to llama.cpp's ids and decodes to its text") {
  SY_REQUIRE_TEST_MODELS(m);
  REQUIRE(m->families.size() == (env_models_dir() ? m->families.size() : 7));  // the generated families
  for (const family_ref& f : m->families) {
    const json& cases = f.ref.at("cases");
    WARN(f.family << ": " << cases.size() << " cases against llama.cpp (" << f.path.filename().string() << ")");
    CHECK(cases.size() >= 400);
    const bool clean_spaces = f.family == "llama3";  // llama-bpe; qwen2 and SentencePiece do not
    for (const json& c : cases) {
      const std::string text = c.at("text");
      const bool add_bos = c.at("add_bos"), parse_special = c.at("parse_special");
      const std::vector<token_id> want = ids_of(c.at("ids"));
      INFO(f.family << ": \"" << text << "\" add_bos=" << add_bos << " parse_special=" << parse_special);
      CHECK(f.tok.encode(text, {.add_special = add_bos, .parse_special = parse_special}) == want);
      const std::string pieces = c.at("pieces"), pieces_special = c.at("pieces_special");
      CHECK(f.tok.decode(want) == pieces);
      CHECK(f.tok.decode(want, true) == pieces_special);
      CHECK(stream_decode(f.tok, want, false) == pieces);
      CHECK(stream_decode(f.tok, want, true) == pieces_special);
      CHECK(llama_detokenize_like(f.tok, want, clean_spaces) == c.at("detok").get<std::string>());
    }
  }
}

TEST_CASE("tokenizer families: text that is not valid UTF-8 encodes and decodes as in llama.cpp") {
  SY_REQUIRE_TEST_MODELS(m);
  auto from_hex = [](const std::string& h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
    return out;
  };
  for (const family_ref& f : m->families) {
    REQUIRE(f.ref.contains("raw_cases"));
    for (const json& c : f.ref.at("raw_cases")) {
      const std::string bytes = from_hex(c.at("hex"));
      const bool add_bos = c.at("add_bos");
      INFO(f.family << ": " << c.at("hex").get<std::string>() << " add_bos=" << add_bos);
      const std::vector<token_id> want = ids_of(c.at("ids"));
      CHECK(f.tok.encode(bytes, {.add_special = add_bos, .parse_special = false}) == want);
      CHECK(f.tok.decode(want) == from_hex(c.at("pieces_hex")));
    }
  }
}

TEST_CASE("tokenizer families: BOS/EOS, end-of-generation and control ids are llama.cpp's") {
  SY_REQUIRE_TEST_MODELS(m);
  for (const family_ref& f : m->families) {
    INFO(f.family);
    const json& r = f.ref;
    REQUIRE(f.tok.vocab_size() == r.at("n_vocab").get<size_t>());
    CHECK(f.tok.bos() == r.at("bos").get<token_id>());
    CHECK(f.tok.eos() == r.at("eos").get<token_id>());
    CHECK(f.tok.add_bos() == r.at("add_bos").get<bool>());
    CHECK(f.tok.add_eos() == r.at("add_eos").get<bool>());
    std::vector<token_id> eog, control;
    for (token_id id = 0; id < static_cast<token_id>(f.tok.vocab_size()); ++id) {
      if (f.tok.is_eog(id)) eog.push_back(id);
      if (f.tok.is_control(id)) control.push_back(id);
    }
    CHECK(eog == ids_of(r.at("eog")));
    CHECK(control == ids_of(r.at("control")));
    if (r.at("eot").get<token_id>() >= 0) CHECK(f.tok.is_eog(r.at("eot").get<token_id>()));
  }
}

TEST_CASE("tokenizer families: what each family is known to do") {
  SY_REQUIRE_TEST_MODELS(m);
  for (const family_ref& f : m->families) {
    const tokenizer& tok = f.tok;
    INFO(f.family);
    if (f.family == "llama3") {
      CHECK(tok.model() == "gpt2");
      CHECK(tok.pre_tokenizer() == "llama-bpe");
      CHECK(tok.add_bos());
      CHECK(tok.encode("Hi").front() == tok.find("<|begin_of_text|>"));
      for (const char* t : {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"}) CHECK(tok.is_eog(tok.find(t)));
      CHECK_FALSE(tok.is_eog(tok.find("<|start_header_id|>")));
    } else if (f.family == "qwen2") {
      CHECK(tok.pre_tokenizer() == "qwen2");
      CHECK_FALSE(tok.add_bos());
      CHECK(tok.encode("Hi") == tok.encode("Hi", {.add_special = false}));
      for (const char* t : {"<|im_end|>", "<|endoftext|>"}) CHECK(tok.is_eog(tok.find(t)));
      CHECK_FALSE(tok.is_eog(tok.find("<|im_start|>")));
    } else if (f.family == "phi4") {
      // Phi-4-mini: the o200k split (`gpt-4o`), no BOS, <|end|> and <|endoftext|> end generation.
      CHECK(tok.model() == "gpt2");
      CHECK(tok.pre_tokenizer() == "gpt-4o");
      CHECK_FALSE(tok.add_bos());
      for (const char* t : {"<|end|>", "<|endoftext|>"}) CHECK(tok.is_eog(tok.find(t)));
      CHECK_FALSE(tok.is_eog(tok.find("<|assistant|>")));
      // A lower-to-upper case change starts a piece (upper-case runs lead the next word:
      // "HTTPServer" stays one piece), so no token spans it.
      for (const auto& [word, seam] : std::vector<std::pair<std::string, std::string>>{
               {"iPhone", "iP"}, {"getHTTPResponse", "tH"}, {"camelCase", "lC"}, {"eBay", "eB"}}) {
        INFO(word);
        std::string joined;
        for (const token_id id : tok.encode(word)) {
          const std::string piece = tok.decode(std::vector<token_id>{id});
          CHECK(piece.find(seam) == std::string::npos);
          joined += piece;
        }
        CHECK(joined == word);
      }
    } else if (f.family == "gemma3") {
      // SentencePiece without the space prefix (Gemma's vocabularies).
      CHECK(tok.model() == "llama");
      CHECK(tok.add_bos());
      CHECK_FALSE(tok.add_space_prefix());
      CHECK(tok.decode(tok.encode("Hi", {.add_special = false})) == "Hi");
      CHECK(tok.find("<start_of_turn>") >= 0);
    } else if (f.family == "mistral") {
      CHECK(tok.model() == "llama");
      CHECK(tok.add_bos());
      CHECK(tok.add_space_prefix());
      const token_id inst = tok.find("[INST]"), end_inst = tok.find("[/INST]");
      REQUIRE(inst >= 0);
      REQUIRE(end_inst >= 0);
      // A space is prepended at the start and after each special token, and kept on decode.
      const auto ids = tok.encode("[INST] Hi [/INST]");
      REQUIRE(ids.size() >= 4);
      CHECK(ids[0] == tok.bos());
      CHECK(ids[1] == inst);
      CHECK(ids.back() == end_inst);
      CHECK(tok.decode(ids) == "  Hi ");
      CHECK(tok.decode(ids, true) == "<s>[INST]  Hi [/INST]");
      CHECK(tok.decode(tok.encode("Hi", {.add_special = false})) == " Hi");
      // Without parse_special the brackets are text, spelled from byte or character tokens.
      for (const token_id id : tok.encode("[INST]", {.add_special = false, .parse_special = false}))
        CHECK_FALSE(tok.is_control(id));
      // A character outside the vocabulary falls back to its UTF-8 bytes' <0xXX> tokens.
      const auto bytes = tok.encode("\xF0\x9F\xA6\x99", {.add_special = false});  // U+1F999, not in the training text
      CHECK(tok.decode(bytes) == " \xF0\x9F\xA6\x99");
      CHECK(tok.is_eog(tok.eos()));
      CHECK(tok.decode(std::vector<token_id>{tok.eos()}).empty());
    }
  }
}

TEST_CASE("tokenizer families: a router's copy from tokenizer_spec_from encodes like from_gguf, for every model") {
  SY_REQUIRE_TEST_MODELS(m);
  std::map<std::string, const family_ref*> by_family;
  for (const family_ref& f : m->families) by_family[f.family] = &f;
  REQUIRE(m->files.size() >= (env_models_dir() ? 1u : 3u));
  for (const model_file& mf : m->files) {
    INFO(mf.path.string());
    const auto file = sy::gguf::file::open(mf.path.string());
    const tokenizer local = tokenizer::from_gguf(file);
    // What a worker serving this file sends in `welcome`, through the wire encoding and back.
    sy::proto::welcome w;
    w.tokenizer = sy::tokenizer_spec_from(file);
    const auto decoded = sy::proto::decode("welcome", sy::proto::encode(w));
    REQUIRE(decoded.ok());
    const sy::proto::tokenizer_spec& spec = decoded.get_if<sy::proto::welcome>()->tokenizer;
    CHECK(spec == w.tokenizer);
    const tokenizer remote = tokenizer::from_spec(spec);

    REQUIRE(remote.vocab_size() == local.vocab_size());
    CHECK(remote.model() == local.model());
    CHECK(remote.pre_tokenizer() == local.pre_tokenizer());
    CHECK(remote.bos() == local.bos());
    CHECK(remote.eos() == local.eos());
    CHECK(remote.add_bos() == local.add_bos());
    CHECK(remote.add_eos() == local.add_eos());
    CHECK(remote.add_space_prefix() == local.add_space_prefix());
    size_t n_differ = 0;
    for (token_id id = 0; id < static_cast<token_id>(local.vocab_size()); ++id) {
      n_differ += remote.is_eog(id) != local.is_eog(id) || remote.is_control(id) != local.is_control(id) ||
                  remote.token_bytes(id, true) != local.token_bytes(id, true) ||
                  remote.token_bytes(id) != local.token_bytes(id);
    }
    CHECK(n_differ == 0);

    // Every weight type of a family has the f16 file's vocabulary: llama.cpp's ids again.
    REQUIRE(by_family.count(mf.family) == 1);
    for (const json& c : by_family[mf.family]->ref.at("cases")) {
      const std::string text = c.at("text");
      const bool add_bos = c.at("add_bos"), parse_special = c.at("parse_special");
      INFO("\"" << text << "\" add_bos=" << add_bos << " parse_special=" << parse_special);
      const std::vector<token_id> want = ids_of(c.at("ids"));
      CHECK(local.encode(text, {.add_special = add_bos, .parse_special = parse_special}) == want);
      CHECK(remote.encode(text, {.add_special = add_bos, .parse_special = parse_special}) == want);
    }
  }
}

TEST_CASE("tokenizer families: a SentencePiece spec without scores or with a bad one is handled") {
  SY_REQUIRE_TEST_MODELS(m);
  for (const family_ref& f : m->families) {
    if (f.tok.model() != "llama") continue;
    sy::proto::tokenizer_spec spec = sy::tokenizer_spec_from(sy::gguf::file::open(f.path.string()));
    REQUIRE(spec.scores.size() == spec.tokens.size());
    CHECK(spec.add_space_prefix == (f.family != "gemma3"));
    sy::proto::tokenizer_spec bad = spec;
    bad.scores.pop_back();
    CHECK_THROWS_WITH(tokenizer::from_spec(bad), Catch::Contains("scores has"));
    bad = spec;
    bad.eot_id = static_cast<int32_t>(bad.tokens.size());
    CHECK_THROWS_WITH(tokenizer::from_spec(bad), Catch::Contains("outside the vocabulary"));
    // No scores: every merge ties, so pairs merge left to right (llama.cpp reads missing scores as 0).
    bad = spec;
    bad.scores.clear();
    const tokenizer flat = tokenizer::from_spec(bad);
    CHECK(flat.decode(flat.encode("Hello world", {.add_special = false})) ==
          (spec.add_space_prefix ? " Hello world" : "Hello world"));
  }
}

// llama.cpp's text-based token rules on a small byte-level vocabulary whose special-looking
// tokens are all typed NORMAL. The expectations are what llama.cpp (llama-cpp-python 0.3.36)
// reports for the same vocabulary written as a GGUF file.
TEST_CASE("tokenizer: llama.cpp's text-based end-of-generation and attribute rules") {
  sy::proto::tokenizer_spec spec;
  spec.model = "gpt2";
  spec.pre = "gpt-2";
  // The 256 byte characters of GPT-2's bytes_to_unicode, in its order.
  std::vector<uint32_t> cps;
  for (uint32_t b = '!'; b <= '~'; ++b) cps.push_back(b);
  for (uint32_t b = 0xA1; b <= 0xAC; ++b) cps.push_back(b);
  for (uint32_t b = 0xAE; b <= 0xFF; ++b) cps.push_back(b);
  for (uint32_t n = 0; cps.size() < 256; ++n) cps.push_back(256 + n);
  for (const uint32_t cp : cps) {
    std::string t;
    if (cp < 0x80) {
      t += static_cast<char>(cp);
    } else {
      t += static_cast<char>(0xC0 | (cp >> 6));
      t += static_cast<char>(0x80 | (cp & 0x3F));
    }
    spec.tokens.push_back(t);
  }
  spec.tokens.push_back("ab");
  for (const char* t : {"<|fim_prefix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|return|>", "<|call|>",
                        "<|end|>", "<|channel|>", "</s>", "<|tool_response>", "<PAD>"})
    spec.tokens.push_back(t);
  spec.token_types.assign(spec.tokens.size(), 1);  // all NORMAL
  spec.merges = {"a b"};
  auto id = [&](std::string_view t) {
    return static_cast<token_id>(std::find(spec.tokens.begin(), spec.tokens.end(), t) - spec.tokens.begin());
  };
  spec.bos_id = id("a");
  spec.eos_id = id("b");
  spec.fim_pad_id = id("x");  // declared: <|fim_pad|> and <PAD> are then not looked for

  const tokenizer tok = tokenizer::from_spec(spec);
  std::vector<std::string> eog, control;
  for (token_id i = 0; i < static_cast<token_id>(tok.vocab_size()); ++i) {
    if (tok.is_eog(i)) eog.push_back(spec.tokens[i]);
    if (tok.is_control(i)) control.push_back(spec.tokens[i]);
  }
  CHECK(eog == std::vector<std::string>{"b", "x", "<|repo_name|>", "<|file_sep|>", "<|return|>", "<|call|>",
                                        "<|tool_response>"});
  CHECK(control == std::vector<std::string>{"<|fim_prefix|>", "<|repo_name|>", "<|file_sep|>", "<|return|>", "<|call|>",
                                            "<|tool_response>"});
  // <|end|> (with <|return|> and <|call|> present) and <|channel|> become user-defined: matched
  // as specials even without parse_special, and always rendered.
  for (const bool parse_special : {false, true}) {
    CHECK(tok.encode("x<|channel|>y", {.add_special = false, .parse_special = parse_special}) ==
          std::vector<token_id>{id("x"), id("<|channel|>"), id("y")});
    CHECK(tok.encode("<|end|>", {.add_special = false, .parse_special = parse_special}) ==
          std::vector<token_id>{id("<|end|>")});
    // </s> (with <|tool_response>) and an undetected <PAD> stay normal text.
    CHECK(tok.encode("</s>", {.add_special = false, .parse_special = parse_special}) ==
          std::vector<token_id>{id("<"), id("/"), id("s"), id(">")});
  }
  CHECK(tok.decode(std::vector<token_id>{id("<|end|>"), id("<|channel|>"), id("</s>"), id("<|return|>")}) ==
        "<|end|><|channel|></s>");
}
