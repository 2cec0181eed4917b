// Tokenizer and chat-template tests. The model-level cases compare against llama.cpp's own
// output, recorded by tests/tools/make_fixtures.py into tests/fixtures/{tokenizer,logits}.json;
// they skip (with a warning) when the model file is absent.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/gguf.hpp"
#include "common/tokenizer/chat_template.hpp"
#include "common/tokenizer/pre_tokenizer.hpp"
#include "common/tokenizer/stream_decoder.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "common/wire/protocol.hpp"
#include "tests/unit/prerequisite.hpp"
#include "worker/service/worker_service.hpp"

using sy::chat_message;
using sy::chat_template;
using sy::token_id;
using sy::tokenizer;
using json = nlohmann::json;

namespace {

constexpr const char* k_default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// The model's tokenizer and chat template, loaded once; null when the model file is absent.
struct model_assets {
  tokenizer tok;
  chat_template tmpl;
};

const model_assets* assets() {
  static const std::unique_ptr<model_assets> a = []() -> std::unique_ptr<model_assets> {
    if (!sy::test::model_present()) return nullptr;
    const auto f = sy::gguf::file::open(sy::test::model_path());
    return std::make_unique<model_assets>(model_assets{tokenizer::from_gguf(f), chat_template::from_gguf(f)});
  }();
  return a.get();
}

// The model's tokenizer and template as `var`; skips without the model (prerequisite.hpp).
#define SY_REQUIRE_MODEL(var)         \
  SY_REQUIRE_MODEL_FILE();            \
  const model_assets* var = assets(); \
  REQUIRE(var != nullptr)

json read_fixture(const char* name) {
  const std::string path = std::string(SY_FIXTURES_DIR) + "/" + name;
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

// Strict UTF-8 check (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = p[i];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80) {
      ++i;
      continue;
    }
    if (b >= 0xC2 && b <= 0xDF)
      n = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
      n = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else
      return false;
    if (i + n > s.size()) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (size_t k = 2; k < n; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

std::vector<token_id> ids_of(const json& a) { return a.get<std::vector<token_id>>(); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Chat template, from Jinja source alone (no model needed)

TEST_CASE("chat template: SmolLM2-style source yields ChatML with its default system prompt") {
  const std::string src =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nYou are a test bot<|im_end|>\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  const chat_template t = chat_template::parse(src);
  CHECK(t.format == sy::chat_format::chatml);
  CHECK(t.default_system == "You are a test bot");
  CHECK(t.apply({{"user", "Hi"}}) ==
        "<|im_start|>system\nYou are a test bot<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(t.apply({{"user", "Hi"}}, false) ==
        "<|im_start|>system\nYou are a test bot<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  CHECK(t.apply({}, true) == "<|im_start|>assistant\n");
}

TEST_CASE("chat template: escaped newlines in the Jinja literal are unescaped") {
  const std::string src =
      "{% if messages[0]['role'] != 'system' %}{{ \"<|im_start|>system\\nBe brief.\\tOK<|im_end|>\\n\" }}"
      "{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
      "'<|im_end|>\\n' }}{% endfor %}";
  CHECK(chat_template::parse(src).default_system == "Be brief.\tOK");
}

TEST_CASE("chat template: ChatML without a fixed system literal has no default") {
  const std::string src =
      "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
      "{% endfor %}{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + "
      "messages[0]['content'] + '<|im_end|>\\n' }}{% endif %}";
  const chat_template t = chat_template::parse(src);
  CHECK(t.default_system.empty());
  CHECK(t.apply({{"user", "x"}}) == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("chat template: other formats are recognised, and no template is ChatML") {
  // More in test_chat_template.cpp.
  CHECK(chat_template::parse("{{ bos_token }}[INST] {{ m }} [/INST]").format == sy::chat_format::llama2);
  CHECK(chat_template::parse("").format == sy::chat_format::chatml);
  CHECK_FALSE(chat_template::parse("{{ m }}").supported());
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer

TEST_CASE("pre-tokenizer: gpt-4o splits at case changes, keeps contractions and cuts digit triples") {
  for (const char* name : {"gpt-4o", "llama4"}) {
    INFO(name);
    const auto pre = sy::text::pre_tokenizer::from_name(name);
    REQUIRE(pre.has_value());
    CHECK_FALSE(pre->ignore_merges());
    auto split = [&](const std::string& text) {
      std::vector<sy::text::pre_tokenizer::piece> pieces;
      pre->split(text, pieces);
      std::vector<std::string> out;
      for (const auto& p : pieces) out.push_back(text.substr(p.begin, p.size));
      return out;
    };
    // Expected pieces: llama.cpp's regex for LLAMA_VOCAB_PRE_TYPE_GPT4O.
    CHECK(split("HTTPServer iPhone I'M they'RE don't 1234567 a/b//c\n\n  x") ==
          std::vector<std::string>{"HTTPServer", " i", "Phone", " I'M", " they'RE", " don't", " ", "123", "456", "7",
                                   " a", "/b", "//", "c", "\n\n", " ", " x"});
    // Only ASCII letters have a case; a combining mark is not a letter and leads the next run.
    CHECK(split("\xC3\x9Cn\xC3\xAF"
                "c\xC3\xB6"
                "d\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC e\xCC\x81x  \n") ==
          std::vector<std::string>{"\xC3\x9Cn\xC3\xAF"
                                   "c\xC3\xB6"
                                   "d\xC3\xA9",
                                   " \xE6\x97\xA5\xE6\x9C\xAC", " e", "\xCC\x81x", "  \n"});
  }
  CHECK_FALSE(sy::text::pre_tokenizer::from_name("o200k-unheard-of").has_value());
}

// ---------------------------------------------------------------------------------------------
// Model tokenizer

TEST_CASE("tokenizer: metadata of the SmolLM2 vocabulary") {
  SY_REQUIRE_MODEL(m);
  const tokenizer& tok = m->tok;
  CHECK(tok.vocab_size() == 49152);
  CHECK(tok.bos() == 1);
  CHECK(tok.eos() == 2);
  CHECK(tok.pre_tokenizer() == "smollm");
  CHECK(tok.find("<|im_start|>") == 1);
  CHECK(tok.find("<|im_end|>") == 2);
  CHECK(tok.find("no such token, surely") == -1);
  // add_bos_token is false for this model: add_bos changes nothing.
  CHECK(tok.encode("Hello") == tok.encode("Hello", {.add_special = false}));
}

TEST_CASE("tokenizer: every fixture string encodes to llama.cpp's ids and decodes back") {
  SY_REQUIRE_MODEL(m);
  const json fx = read_fixture("tokenizer.json");
  REQUIRE(fx.at("cases").size() >= 45);
  for (const json& c : fx.at("cases")) {
    const std::string text = c.at("text");
    const bool parse_special = c.at("parse_special");
    const bool add_bos = c.at("add_bos");
    const std::vector<token_id> want = ids_of(c.at("ids"));
    INFO("text: \"" << text << "\" parse_special=" << parse_special);
    CHECK(m->tok.encode(text, {.add_special = add_bos, .parse_special = parse_special}) == want);
    CHECK(m->tok.decode(want, /*render_special=*/parse_special) == text);
  }
}

TEST_CASE("tokenizer: a router's copy built from the welcome message encodes like the worker's") {
  SY_REQUIRE_MODEL(m);
  // What a worker sends (tokenizer_spec in `welcome`), through the wire encoding and back.
  const auto f = sy::gguf::file::open(sy::test::model_path());
  sy::proto::welcome w;
  w.tokenizer = sy::tokenizer_spec_from(f);
  const auto decoded = sy::proto::decode("welcome", sy::proto::encode(w));
  REQUIRE(decoded.ok());
  const tokenizer copy = tokenizer::from_spec(decoded.get_if<sy::proto::welcome>()->tokenizer);
  CHECK(copy.vocab_size() == m->tok.vocab_size());
  CHECK(copy.eos() == m->tok.eos());
  CHECK(copy.add_bos() == m->tok.add_bos());
  const json fx = read_fixture("tokenizer.json");
  for (const json& c : fx.at("cases")) {
    const std::string text = c.at("text");
    const bool parse_special = c.at("parse_special");
    const bool add_bos = c.at("add_bos");
    INFO("text: \"" << text << "\"");
    const auto ids = ids_of(c.at("ids"));
    CHECK(copy.encode(text, {.add_special = add_bos, .parse_special = parse_special}) == ids);
    for (const token_id id : ids) CHECK(copy.is_eog(id) == m->tok.is_eog(id));
  }
  sy::proto::tokenizer_spec bad = w.tokenizer;
  bad.model = "bert";  // WordPiece
  CHECK_THROWS_WITH(tokenizer::from_spec(bad), Catch::Contains("unsupported tokenizer.ggml.model 'bert'"));
  bad = w.tokenizer;
  bad.pre = "no-such-pre-tokenizer";
  CHECK_THROWS_WITH(tokenizer::from_spec(bad), Catch::Contains("unsupported tokenizer.ggml.pre"));
  bad = w.tokenizer;
  bad.eos_id = static_cast<int32_t>(bad.tokens.size());
  CHECK_THROWS_WITH(tokenizer::from_spec(bad), Catch::Contains("outside the vocabulary"));
}

TEST_CASE("tokenizer: reference prompts encode to the logits fixture's prompt ids") {
  SY_REQUIRE_MODEL(m);
  const json fx = read_fixture("logits.json");
  int n_chat = 0;
  for (const json& c : fx.at("cases")) {
    const std::string prompt = c.at("prompt");
    const bool chat = c.at("chat");
    INFO("prompt: \"" << prompt << "\"");
    CHECK(m->tok.encode(prompt, {.add_special = false, .parse_special = chat}) == ids_of(c.at("prompt_ids")));
    if (!chat) continue;
    ++n_chat;
    // The prompt is our template's rendering of its single user turn.
    const std::string head = "<|im_start|>user\n";
    const size_t b = prompt.find(head);
    REQUIRE(b != std::string::npos);
    const size_t e = prompt.find("<|im_end|>", b);
    const std::string user = prompt.substr(b + head.size(), e - b - head.size());
    const std::string rendered = m->tmpl.apply({{"user", user}});
    CHECK(rendered == prompt);
    CHECK(m->tok.encode(rendered, {.add_special = false}) == ids_of(c.at("prompt_ids")));
  }
  CHECK(n_chat >= 3);
}

TEST_CASE("tokenizer: special tokens are parsed only when asked") {
  SY_REQUIRE_MODEL(m);
  const tokenizer& tok = m->tok;
  const std::string text = "<|im_start|>user\nhi<|im_end|>";

  const auto on = tok.encode(text, {.add_special = false});
  REQUIRE(on.size() >= 3);
  CHECK(on.front() == 1);
  CHECK(on.back() == 2);
  CHECK(tok.decode(on, true) == text);
  CHECK(tok.decode(on, false) == "user\nhi");  // control tokens are not rendered by default

  const auto off = tok.encode(text, {.add_special = false, .parse_special = false});
  for (const token_id id : off) CHECK(id > 16);  // ids 0..16 are the control tokens
  CHECK(off.size() > on.size());
  CHECK(tok.decode(off, false) == text);
}

TEST_CASE("tokenizer: end-of-generation and control tokens") {
  SY_REQUIRE_MODEL(m);
  const tokenizer& tok = m->tok;
  CHECK(tok.is_eog(tok.eos()));
  CHECK(tok.is_eog(tok.find("<|im_end|>")));
  CHECK(tok.is_eog(tok.find("<|endoftext|>")));
  CHECK_FALSE(tok.is_eog(tok.find("<|im_start|>")));
  CHECK_FALSE(tok.is_eog(tok.encode("Hello", {.add_special = false}).at(0)));
  CHECK_FALSE(tok.is_eog(-1));
  CHECK_FALSE(tok.is_eog(static_cast<token_id>(tok.vocab_size())));
  CHECK(tok.is_control(tok.find("<|im_start|>")));
  CHECK_FALSE(tok.is_control(tok.encode("Hello", {.add_special = false}).at(0)));
  CHECK(tok.token_bytes(tok.find("<|im_end|>")).empty());
  CHECK(tok.token_bytes(tok.find("<|im_end|>"), true) == "<|im_end|>");
}

TEST_CASE("tokenizer: invalid UTF-8 input becomes U+FFFD / as in llama.cpp") {
  SY_REQUIRE_MODEL(m);
  const auto ids = m->tok.encode(
      "a\xff"
      "b\xe2\x82",
      {.add_special = false, .parse_special = false});
  CHECK(m->tok.decode(ids) ==
        "a\xEF\xBF\xBD"
        "b\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_CASE("tokenizer: random text round-trips - random bytes decode to valid UTF-8") {
  SY_REQUIRE_MODEL(m);
  const std::vector<std::string> parts = {"a",
                                          "Z",
                                          " ",
                                          "  ",
                                          "\n",
                                          "\t",
                                          "'s",
                                          "'",
                                          "don't",
                                          "7",
                                          "42",
                                          ".",
                                          "!?",
                                          "é",
                                          "ß",
                                          "中",
                                          "文",
                                          "한",
                                          "🍕",
                                          "👩🏽‍💻",
                                          "\u00a0",
                                          "\u3000",
                                          "<|im_start|>",
                                          "<|im_end",
                                          "\u0085",
                                          "hello",
                                          " world"};
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) text += parts[rng() % parts.size()];
    INFO("text: \"" << text << "\"");
    CHECK(m->tok.decode(m->tok.encode(text, {.add_special = false, .parse_special = false})) == text);
    CHECK(m->tok.decode(m->tok.encode(text, {.add_special = false}), true) == text);

    std::string bytes(rng() % 32, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    CHECK(valid_utf8(m->tok.decode(m->tok.encode(bytes, {.add_special = false, .parse_special = false}))));
  }
}

TEST_CASE("stream_decoder: token-by-token output is always valid UTF-8") {
  SY_REQUIRE_MODEL(m);
  const tokenizer& tok = m->tok;
  const std::vector<std::string> texts = {
      "I love pizza 🍕 and tacos 🌮!",
      "Family: 👨‍👩‍👧‍👦 and 👩🏽‍💻 at work",
      "Flags: 🇫🇷 🇯🇵 🇺🇸",
      "你好，世界！今天天气很好。",
      "안녕하세요, 세계! 반갑습니다.",
      "नमस्ते दुनिया, आप कैसे हैं?",
  };
  bool saw_split_character = false;  // some token on its own is not valid UTF-8
  for (const std::string& text : texts) {
    INFO("text: " << text);
    const auto ids = tok.encode(text, {.add_special = false, .parse_special = false});
    sy::stream_decoder dec(tok);
    std::string out;
    for (const token_id id : ids) {
      if (!valid_utf8(tok.token_bytes(id))) saw_split_character = true;
      const std::string piece = dec.push(id);
      CHECK(valid_utf8(piece));
      out += piece;
    }
    CHECK(dec.flush().empty());
    CHECK(out == text);
  }
  CHECK(saw_split_character);
}

TEST_CASE("stream_decoder: held-back and invalid bytes come out as U+FFFD") {
  SY_REQUIRE_MODEL(m);
  const tokenizer& tok = m->tok;
  // Byte-level tokens: "ð" stands for byte 0xF0 (a 4-byte lead), "Ģ" for byte 0x80.
  const token_id lead = tok.find("ð");
  const token_id cont = tok.find("Ģ");
  REQUIRE(lead >= 0);
  REQUIRE(cont >= 0);
  REQUIRE(tok.token_bytes(lead) == "\xF0");
  REQUIRE(tok.token_bytes(cont) == "\x80");

  sy::stream_decoder dec(tok);
  CHECK(dec.push(cont) == "\xEF\xBF\xBD");  // a stray continuation byte is never valid
  CHECK(dec.push(lead).empty());            // may still become a character: held back
  CHECK(dec.flush() == "\xEF\xBF\xBD");
  CHECK(dec.flush().empty());

  // Control tokens: hidden unless rendering specials.
  sy::stream_decoder plain(tok), special(tok, true);
  CHECK(plain.push(tok.find("<|im_end|>")).empty());
  CHECK(special.push(tok.find("<|im_end|>")) == "<|im_end|>");
}

TEST_CASE("chat template: SmolLM2 metadata") {
  SY_REQUIRE_MODEL(m);
  CHECK(m->tmpl.format == sy::chat_format::chatml);
  CHECK(m->tmpl.default_system == k_default_system);

  CHECK(m->tmpl.apply({{"user", "What is the capital of France?"}}) ==
        std::string("<|im_start|>system\n") + k_default_system +
            "<|im_end|>\n"
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
  CHECK(m->tmpl.apply({{"system", "Be terse."}, {"user", "Hi"}}) ==
        "<|im_start|>system\nBe terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(m->tmpl.apply({{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}}, false) ==
        std::string("<|im_start|>system\n") + k_default_system +
            "<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n");
}

TEST_CASE("tokenizer: concurrent encoding from several threads") {
  SY_REQUIRE_MODEL(m);
  const json fx = read_fixture("tokenizer.json");
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        for (const json& c : fx.at("cases")) {
          const auto got = m->tok.encode(c.at("text").get<std::string>(),
                                         {.add_special = false, .parse_special = c.at("parse_special").get<bool>()});
          if (got != ids_of(c.at("ids"))) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const int n : mismatches) CHECK(n == 0);
}

TEST_CASE("tokenizer: encoding a 512-token prompt is fast") {
  SY_REQUIRE_MODEL(m);
  std::string text;
  const std::string para =
      "Switchyard routes each request to a worker, which batches prompts, keeps a paged KV cache "
      "and streams tokens back; on 2024-05-01 it served 12,345 requests (p99 = 87 ms). ";
  while (m->tok.encode(text, {.add_special = false}).size() < 512) text += para;

  const int reps = 50;
  size_t n_tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) n_tokens = m->tok.encode(text, {.add_special = false}).size();
  const auto t1 = std::chrono::steady_clock::now();
  const double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / reps;
  WARN("encode: " << n_tokens << " tokens from " << text.size() << " bytes in " << us << " us");
  // Generous bound so loaded CI machines and sanitizer builds pass; expect well under 1 ms.
  CHECK(us < 10000.0);
}
