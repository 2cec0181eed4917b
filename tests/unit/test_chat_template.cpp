// Chat templates against llama.cpp: every format, by name and recognised from real model
// templates (tests/fixtures/chat_templates/*.jinja), renders what llama.cpp's
// llama_chat_apply_template rendered for the same conversations, as recorded by
// tests/tools/make_chat_fixtures.py into tests/fixtures/chat_templates.json. Then the
// --chat-template option, and a model whose template cannot be applied: it loads, serves
// completions, and says why chats fail (model cases skip with a warning without the model file).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/gguf.hpp"
#include "common/tokenizer/chat_template.hpp"
#include "common/wire/protocol.hpp"
#include "tests/unit/model_env.hpp"
#include "worker/engine/engine.hpp"
#include "worker/model/cpu_backend.hpp"
#include "worker/service/worker_service.hpp"

using Catch::Matchers::Contains;
using sy::chat_format;
using sy::chat_message;
using sy::chat_template;
using json = nlohmann::json;

namespace {

const json& fixture() {
  static const json doc = [] {
    std::ifstream in(std::string(SY_FIXTURES_DIR) + "/chat_templates.json");
    if (!in) throw std::runtime_error("tests/fixtures/chat_templates.json is missing");
    return json::parse(in);
  }();
  return doc;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string template_source(const std::string& file) {
  return read_text(std::string(SY_FIXTURES_DIR) + "/chat_templates/" + file);
}

std::map<std::string, std::vector<chat_message>> conversations_in(const json& list) {
  std::map<std::string, std::vector<chat_message>> out;
  for (const json& c : list) {
    std::vector<chat_message>& msgs = out[c.at("name").get<std::string>()];
    for (const json& m : c.at("messages")) msgs.push_back({m.at("role"), m.at("content")});
  }
  return out;
}

// The fixture's conversations by name.
const std::map<std::string, std::vector<chat_message>>& conversations() {
  static const auto by_name = conversations_in(fixture().at("conversations"));
  return by_name;
}

// Checks every recorded rendering; returns how many were compared.
size_t check_renders(const chat_template& t, const json& renders, const std::string& what) {
  size_t n = 0;
  for (const json& r : renders) {
    const std::string conv = r.at("conversation");
    const bool gen = r.at("add_generation_prompt");
    INFO(what << ", conversation " << conv << (gen ? ", with" : ", without") << " the generation prompt");
    CHECK(t.apply(conversations().at(conv), gen) == r.at("text").get<std::string>());
    ++n;
  }
  return n;
}

// A temporary file, removed when the test ends.
struct temp_file {
  explicit temp_file(const std::string& name, const std::string& text = "")
      : path(std::filesystem::temp_directory_path() / ("sy_" + std::to_string(::getpid()) + "_" + name)) {
    std::ofstream(path, std::ios::binary) << text;
  }
  ~temp_file() { std::filesystem::remove(path); }
  std::filesystem::path path;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Against llama.cpp

TEST_CASE("chat template: every format, by name, renders what llama.cpp renders") {
  const json& formats = fixture().at("formats");
  REQUIRE(formats.size() == 16);
  size_t n = 0;
  for (const json& f : formats) {
    const std::string name = f.at("name");
    const chat_template t = chat_template::parse(name);
    REQUIRE(t.supported());
    CHECK(sy::chat_format_name(t.format) == name);
    CHECK(t.default_system.empty());
    n += check_renders(t, f.at("renders"), name);
  }
  CHECK(n == 16 * 2 * conversations().size());
}

TEST_CASE("chat template: model templates are recognised as llama.cpp recognises them") {
  const json& sources = fixture().at("sources");
  REQUIRE(sources.size() >= 20);
  size_t n_supported = 0, n_renders = 0;
  for (const json& s : sources) {
    const std::string file = s.at("file");
    INFO("template " << file);
    const chat_template t = chat_template::parse(template_source(file));
    const std::string expected = s.at("llama_cpp_format").is_null() ? "" : s.at("llama_cpp_format").get<std::string>();
    if (sy::chat_format_from_name(expected)) {
      CHECK(sy::chat_format_name(t.format) == expected);
      CHECK(t.default_system == s.at("default_system").get<std::string>());
      n_renders += check_renders(t, s.at("renders"), file);
      ++n_supported;
    } else {
      // llama.cpp renders these as a format Switchyard does not (glmedge), or refuses them.
      CHECK_FALSE(t.supported());
      CHECK_THAT(t.unsupported_reason,
                 Contains(expected.empty() ? "matches none of the formats" : "'" + expected + "' format"));
      CHECK_THROWS_WITH(t.apply({{"user", "hi"}}), Contains(t.unsupported_reason));
    }
  }
  CHECK(n_supported == 20);
  CHECK(n_renders == n_supported * 2 * conversations().size());
}

TEST_CASE("chat template: ChatML keeps the default system prompt that llama.cpp ignores") {
  const chat_template smol = chat_template::parse(template_source("smollm2-instruct.jinja"));
  const chat_template qwen = chat_template::parse(template_source("qwen2.5-instruct.jinja"));
  CHECK(smol.default_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  CHECK(qwen.default_system == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  CHECK(qwen.apply({{"user", "Hi"}}, false) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n");
  // Given by name, ChatML has no default.
  CHECK(chat_template::parse("chatml").apply({{"user", "Hi"}}, false) == "<|im_start|>user\nHi<|im_end|>\n");
}

TEST_CASE("chat template: Phi-4's template is phi4, not ChatML, and renders as llama.cpp's phi4") {
  const chat_template t = chat_template::parse(template_source("phi-4.jinja"));
  REQUIRE(t.format == chat_format::phi4);
  CHECK(t.default_system.empty());
  CHECK_FALSE(t.thinking_switch);
  CHECK(t.apply({{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}}) ==
        "<|im_start|>system<|im_sep|>S<|im_end|><|im_start|>user<|im_sep|>U<|im_end|><|im_start|>assistant<|im_sep|>A"
        "<|im_end|><|im_start|>user<|im_sep|>V<|im_end|><|im_start|>assistant<|im_sep|>");
  CHECK(t.apply({{"user", " U\n"}}, false) == "<|im_start|>user<|im_sep|> U\n<|im_end|>");
  // Tools go the hermes way, the list in a system turn of phi4's own markers.
  CHECK(sy::tool_style(t.format) == sy::tool_call_style::hermes);
  CHECK_THAT(
      t.apply({{"user", "Weather?"}}, true, {{"weather", R"({"type":"function","function":{"name":"weather"}})", ""}}),
      Contains("<|im_start|>system<|im_sep|>") && Contains("<tool_call>"));
  CHECK(t.to_jinja(false) ==
        "{% for message in messages %}{{ '<|im_start|>' }}{{ message['role'] }}{{ '<|im_sep|>' }}"
        "{{ message['content'] }}{{ '<|im_end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}");
}

TEST_CASE("chat template: a ChatML source that reads enable_thinking can switch thinking off (Qwen3)") {
  const std::string qwen3 =
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
      "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined "
      "and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";
  const chat_template t = chat_template::parse(qwen3);
  REQUIRE(t.format == chat_format::chatml);
  CHECK(t.thinking_switch);
  const std::string base = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  CHECK(t.apply({{"user", "Hi"}}) == base);
  CHECK(t.apply({{"user", "Hi"}}, true, {}, false) == base + "<think>\n\n</think>\n\n");
  CHECK(t.apply({{"user", "Hi"}}, false, {}, false) == "<|im_start|>user\nHi<|im_end|>\n");
  // A template without the switch ignores it, as its Jinja would.
  const chat_template plain = chat_template::parse("chatml");
  CHECK_FALSE(plain.thinking_switch);
  CHECK(plain.apply({{"user", "Hi"}}, true, {}, false) == base);
  CHECK_THAT(t.to_jinja(false), Catch::Contains("enable_thinking is false"));
}

namespace {

// A reasoning model's conversation given back: a system prompt, a past turn with its thinking
// in the content (as the model wrote it), a second past turn without, and the new question.
const std::vector<chat_message> k_thinking_history = {
    {"system", "Be brief."}, {"user", "2+2?"},    {"assistant", "<think>\nAdd them.\n</think>\n\n4"},
    {"user", "Times 3?"},    {"assistant", "12"}, {"user", "Minus 1?"},
};

// Qwen3's template, cut to what Switchyard reads: ChatML, the thinking switch, and the split of
// past assistant content at </think> (recognised by the tag).
const std::string k_qwen3 =
    "{%- for message in messages %}{%- if message.role == 'assistant' and '</think>' in message.content %}"
    "{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and "
    "enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

}  // namespace

TEST_CASE("chat template: DeepSeek-R1 distills render deepseek3, open the thinking and drop past thinking") {
  const chat_template r1 = chat_template::parse(template_source("deepseek-r1-distill.jinja"));
  REQUIRE(r1.format == chat_format::deepseek3);
  CHECK(r1.opens_thinking);
  CHECK(r1.drops_past_thinking);
  CHECK_FALSE(r1.thinking_switch);
  CHECK(r1.default_system.empty());
  // llama.cpp's deepseek3 ("S\n\n", <｜User｜>, <｜Assistant｜>A<｜end▁of▁sentence｜>), the past
  // thinking gone up to and with its </think> (the rest as it is, as R1's split('</think>')[-1]
  // leaves it), and the generation prompt open in thinking.
  const std::string history =
      "Be brief.\n\n<｜User｜>2+2?<｜Assistant｜>\n\n4<｜end▁of▁sentence｜><｜User｜>Times 3?<｜Assistant｜>12"
      "<｜end▁of▁sentence｜><｜User｜>Minus 1?";
  CHECK(r1.apply(k_thinking_history) == history + "<｜Assistant｜><think>\n");
  CHECK(r1.apply(k_thinking_history, false) == history);
  // Every assistant turn loses its thinking, the last one too; tool results are not written.
  CHECK(r1.apply({{"user", "Hi"}, {"assistant", "<think>a</think>b</think>Hello"}}, false) ==
        "<｜User｜>Hi<｜Assistant｜>Hello<｜end▁of▁sentence｜>");
  // enable_thinking is not read: the R1 template has no switch.
  CHECK(r1.apply({{"user", "Hi"}}, true, {}, false) == "<｜User｜>Hi<｜Assistant｜><think>\n");

  // By name, or from the first R1 template (no <think> in the generation prompt), it does not open.
  const chat_template named = chat_template::parse("deepseek3");
  CHECK_FALSE(named.opens_thinking);
  CHECK_FALSE(named.drops_past_thinking);
  CHECK(named.apply({{"user", "Hi"}}) == "<｜User｜>Hi<｜Assistant｜>");
  CHECK(named.apply({{"user", "Hi"}, {"assistant", "<think>x</think>y"}}, false) ==
        "<｜User｜>Hi<｜Assistant｜><think>x</think>y<｜end▁of▁sentence｜>");
  std::string first = template_source("deepseek-r1-distill.jinja");
  const std::string gen = "{{'<｜Assistant｜><think>\\n'}}";
  REQUIRE(first.find(gen) != std::string::npos);
  first.replace(first.find(gen), gen.size(), "{{'<｜Assistant｜>'}}");
  const chat_template old = chat_template::parse(first);
  CHECK(old.format == chat_format::deepseek3);
  CHECK_FALSE(old.opens_thinking);
  CHECK(old.drops_past_thinking);
  CHECK(old.apply({{"user", "Hi"}}) == "<｜User｜>Hi<｜Assistant｜>");

  // Exported as Jinja with the same pieces.
  const std::string j = r1.to_jinja(true);
  CHECK_THAT(j, Contains("{{ bos_token }}") && Contains("split('</think>')[-1] %}") &&
                    Contains("{{ '<｜Assistant｜><think>\\n' }}"));
}

TEST_CASE("chat template: past thinking renders as Qwen3's, R1's and V3.1's own templates render it") {
  // Recorded with jinja2 from the templates themselves (tests/tools/make_chat_fixtures.py), some
  // with template variables set (`kwargs`: Qwen3's `enable_thinking`, DeepSeek-V3.1's `thinking`).
  const auto convs = conversations_in(fixture().at("thinking_conversations"));
  size_t n_sources = 0;
  for (const json& s : fixture().at("sources")) {
    if (!s.contains("template_renders")) continue;
    ++n_sources;
    const std::string file = s.at("file");
    const chat_template t = chat_template::parse(template_source(file));
    CHECK((t.drops_past_thinking || t.closes_past_thinking));
    // Every conversation but the skipped ones (where the template differs from llama.cpp outside
    // the thinking), with and without the generation prompt, unset and under each variable set.
    const size_t n_skipped = s.at("template_renders_skip").size();
    size_t n = 0, n_kwargs = 0;
    for (const json& r : s.at("template_renders")) {
      const std::string conv = r.at("conversation");
      const bool gen = r.at("add_generation_prompt");
      std::optional<bool> thinking;
      if (r.contains("kwargs")) {
        const json& kw = r.at("kwargs");
        thinking = kw.contains("thinking") ? kw.at("thinking").get<bool>() : kw.at("enable_thinking").get<bool>();
        ++n_kwargs;
      }
      INFO(file << ", conversation " << conv << (gen ? ", with" : ", without") << " the generation prompt"
                << (r.contains("kwargs") ? ", " + r.at("kwargs").dump() : ""));
      CHECK(t.apply(convs.at(conv), gen, {}, thinking) == r.at("text").get<std::string>());
      ++n;
    }
    INFO(file);
    CHECK(n_skipped < convs.size());
    CHECK(n == (n_kwargs == 0 ? 1 : 3) * 2 * (convs.size() - n_skipped));
    CHECK(n_kwargs == (file == "deepseek-r1-distill.jinja" ? 0 : 2) * 2 * (convs.size() - n_skipped));
  }
  CHECK(n_sources == 3);
  const chat_template qwen3 = chat_template::parse(template_source("qwen3.jinja"));
  CHECK(qwen3.thinking_switch);
  CHECK(qwen3.default_system.empty());
}

TEST_CASE("chat template: Qwen3 drops the thinking of turns before the last user message") {
  const chat_template t = chat_template::parse(k_qwen3);
  REQUIRE(t.format == chat_format::chatml);
  CHECK(t.thinking_switch);
  CHECK(t.drops_past_thinking);
  CHECK_FALSE(t.opens_thinking);
  const std::string history =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
      "<|im_start|>user\nTimes 3?<|im_end|>\n<|im_start|>assistant\n12<|im_end|>\n<|im_start|>user\nMinus "
      "1?<|im_end|>\n";
  CHECK(t.apply(k_thinking_history) == history + "<|im_start|>assistant\n");
  CHECK(t.apply(k_thinking_history, true, {}, false) == history + "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Turns after the last user message (a tool-calling step of the current answer) keep theirs,
  // as Qwen3 keeps it; the newlines after </think> go only with the thinking.
  const std::vector<chat_message> step = {
      {"user", "Weather?"},
      {"assistant", "<think>\nLook it up.\n</think>\n\nChecking.", {{"c1", "weather", "{}"}}},
      {"tool", "sunny", {}, "c1"},
  };
  CHECK_THAT(t.apply(step), Contains("<|im_start|>assistant\n<think>\nLook it up.\n</think>\n\nChecking."));
  CHECK(t.apply({{"assistant", "<think>x</think>\n\n\nA"}, {"user", "B"}}, false) ==
        "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nB<|im_end|>\n");
  // A ChatML template without </think> (Qwen2.5, SmolLM2, or by name) keeps the text as sent.
  const chat_template plain = chat_template::parse("chatml");
  CHECK_FALSE(plain.drops_past_thinking);
  CHECK_THAT(plain.apply(k_thinking_history), Contains("<think>\nAdd them.\n</think>\n\n4"));
  CHECK_FALSE(chat_template::parse(template_source("qwen2.5-instruct.jinja")).drops_past_thinking);
  // Writing the tag (an empty thinking block) is not dropping it.
  CHECK_FALSE(chat_template::parse("<|im_start|>{{ '<think>\\n\\n</think>\\n\\n' }}").drops_past_thinking);
  CHECK(chat_template::parse("<|im_start|>{{ c.split(\"</think>\")[-1] }}").drops_past_thinking);
  CHECK_THAT(t.to_jinja(false), Contains("loop.index0 > ns_past.last_query") && Contains(".lstrip('\\n')"));
}

TEST_CASE("chat template: DeepSeek-V3.1 switches thinking by `thinking` and closes past thinking") {
  const chat_template v31 = chat_template::parse(template_source("deepseek-v3.1.jinja"));
  REQUIRE(v31.format == chat_format::deepseek3);
  CHECK(v31.thinking_switch);
  CHECK(v31.closes_past_thinking);
  CHECK_FALSE(v31.opens_thinking);
  CHECK_FALSE(v31.drops_past_thinking);
  // The template's default is off: the generation prompt closes the thinking; on, it opens it.
  const std::vector<chat_message> chat = {{"system", "You are a helpful assistant"},
                                          {"user", "Hello"},
                                          {"assistant", "<think>\nGreet.\n</think>Hi there"},
                                          {"user", "How are you?"}};
  const std::string history =
      "You are a helpful assistant\n\n<｜User｜>Hello<｜Assistant｜></think>Hi there<｜end▁of▁sentence｜><｜User｜>How "
      "are "
      "you?";
  CHECK(v31.apply(chat) == history + "<｜Assistant｜></think>");
  CHECK(v31.apply(chat, true, {}, false) == history + "<｜Assistant｜></think>");
  CHECK(v31.apply(chat, true, {}, true) == history + "<｜Assistant｜><think>");
  CHECK(v31.apply(chat, false, {}, true) == history);
  // Only the first </think> ends the dropped part, as the template's split('</think>', 1)[1].
  CHECK(v31.apply({{"user", "a"}, {"assistant", "x</think>y</think>z"}}, false) ==
        "<｜User｜>a<｜Assistant｜></think>y</think>z<｜end▁of▁sentence｜>");
  // Tool turns in DeepSeek's tokens, as V3.1's template writes them (every deepseek3 template:
  // common/tokenizer/chat_tools.cpp), past calls closed the same; the tool list after the system prompt.
  const std::string with_call =
      v31.apply({{"user", "Weather?"}, {"assistant", "", {{"c1", "weather", "{}"}}}, {"tool", "sunny", {}, "c1"}}, true,
                {}, true);
  CHECK_THAT(with_call,
             Contains("<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>weather<｜tool▁sep｜>{}"
                      "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>sunny"
                      "<｜tool▁output▁end｜>"));
  CHECK(with_call.ends_with("<｜Assistant｜><think>"));
  const std::vector<sy::chat_tool> tools = {{"weather", R"({"type":"function","function":{"name":"weather"}})", ""}};
  CHECK(v31.apply({{"system", "Be brief."}, {"user", "Weather?"}}, true, tools).rfind("Be brief.\n\n## Tools\n", 0) ==
        0);

  // Qwen3's switch and R1's templates are untouched: their defaults stay on and open.
  const chat_template qwen3 = chat_template::parse(template_source("qwen3.jinja"));
  CHECK_FALSE(qwen3.closes_past_thinking);
  CHECK(qwen3.apply({{"user", "Hi"}}) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(qwen3.apply({{"user", "Hi"}}, true, {}, false) ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  const chat_template r1 = chat_template::parse(template_source("deepseek-r1-distill.jinja"));
  CHECK_FALSE(r1.thinking_switch);
  CHECK(r1.apply({{"user", "Hi"}}, true, {}, false) == "<｜User｜>Hi<｜Assistant｜><think>\n");
  // By name, deepseek3 is llama.cpp's: no switch.
  CHECK(chat_template::parse("deepseek3").apply({{"user", "Hi"}}, true, {}, true) == "<｜User｜>Hi<｜Assistant｜>");

  // Exported as Jinja that reads the same variable.
  const std::string j = v31.to_jinja(false);
  CHECK_THAT(j, Contains("{% if thinking is defined and thinking %}{{ '<think>' }}{% else %}{{ '</think>' }}") &&
                    Contains("split('</think>', 1)[1]"));
}

// ---------------------------------------------------------------------------------------------
// Recognition details (llama.cpp's rules and order)

TEST_CASE("chat template: names and formats map one to one") {
  const std::string names = sy::chat_format_names();
  CHECK(names ==
        "chatml, llama3, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, mistral-v1, mistral-v3, "
        "mistral-v3-tekken, mistral-v7, mistral-v7-tekken, phi3, phi4, zephyr, gemma, deepseek3");
  for (int i = static_cast<int>(chat_format::chatml); i <= static_cast<int>(chat_format::deepseek3); ++i) {
    const auto f = static_cast<chat_format>(i);
    const std::string_view name = sy::chat_format_name(f);
    CHECK_FALSE(name.empty());
    CHECK(sy::chat_format_from_name(name) == f);
  }
  CHECK(sy::chat_format_name(chat_format::unsupported).empty());
  CHECK_FALSE(sy::chat_format_from_name("glmedge"));
  CHECK_FALSE(sy::chat_format_from_name("Llama3"));
  CHECK_FALSE(sy::chat_format_from_name(""));
}

TEST_CASE("chat template: rules apply in llama.cpp's order") {
  auto format_of = [](std::string_view src) { return chat_template::parse(src).format; };
  // No template: ChatML, like llama.cpp's fallback.
  CHECK(format_of("") == chat_format::chatml);
  CHECK(chat_template::parse("").supported());
  // <|im_start|> wins over everything after it, unless <|im_sep|> (phi4) or <end_of_utterance>.
  CHECK(format_of("<|im_start|>[INST]<|start_header_id|><|end_header_id|>") == chat_format::chatml);
  CHECK(format_of("<|im_start|><|im_sep|><end_of_utterance>") == chat_format::phi4);
  CHECK_THAT(chat_template::parse("<|im_start|><end_of_utterance>").unsupported_reason, Contains("'smolvlm'"));
  // A source that starts with "mistral" is in the [INST] family.
  CHECK(format_of("mistral whatever") == chat_format::llama2);
  CHECK(format_of("[INST] <start_of_turn>") == chat_format::llama2);
  CHECK(format_of("[INST][SYSTEM_PROMPT]' [INST] ' + system_message") == chat_format::mistral_v7);
  CHECK(format_of("[AVAILABLE_TOOLS] [INST]") == chat_format::mistral_v1);
  CHECK(format_of("[AVAILABLE_TOOLS]\"[INST]\"") == chat_format::mistral_v3_tekken);
  CHECK(format_of("[AVAILABLE_TOOLS]'[INST]'") == chat_format::mistral_v3);
  CHECK(format_of("[INST] content.strip() bos_token + '[INST] <<SYS>>") == chat_format::llama2_sys_strip);
  CHECK(format_of("[INST] bos_token + '[INST] <<SYS>>") == chat_format::llama2_sys_bos);
  CHECK(format_of("[INST] <<SYS>>") == chat_format::llama2_sys);
  // <|assistant|> with <|end|> is Phi-3; with <|user|> it is one of GLM-Edge / Falcon 3 /
  // EXAONE, which shadow Zephyr's rule (the Zephyr model card's template reads as glmedge).
  CHECK(format_of("<|assistant|><|end|><|user|><|endoftext|>") == chat_format::phi3);
  CHECK_THAT(chat_template::parse("<|assistant|><|user|><|endoftext|>").unsupported_reason, Contains("'glmedge'"));
  CHECK_THAT(chat_template::parse("<|assistant|><|user|></s>").unsupported_reason, Contains("'falcon3'"));
  CHECK(format_of("<|user|><|endoftext|>") == chat_format::zephyr);
  // Gemma comes before Llama 3; Llama 3 needs both header tokens.
  CHECK(format_of("<start_of_turn><|start_header_id|><|end_header_id|>") == chat_format::gemma);
  CHECK(format_of("<|start_header_id|><|end_header_id|>") == chat_format::llama3);
  CHECK_FALSE(chat_template::parse("<|start_header_id|>").supported());
  CHECK_THAT(chat_template::parse("USER: x ASSISTANT: y").unsupported_reason, Contains("'vicuna'"));
  // DeepSeek-V3's markers, after Llama 3 and DeepSeek-V2 (whose rule wins when both match).
  const std::string ds3 = "<｜User｜><｜Assistant｜><｜end▁of▁sentence｜>";
  CHECK(format_of(ds3) == chat_format::deepseek3);
  CHECK(format_of(ds3 + "<|start_header_id|><|end_header_id|>") == chat_format::llama3);
  CHECK_THAT(chat_template::parse(ds3 + "'Assistant: ' + message['content'] + eos_token").unsupported_reason,
             Contains("'deepseek2'"));
  CHECK_FALSE(chat_template::parse("<｜User｜><｜Assistant｜>").supported());
  CHECK(chat_template::parse("{{ m }}").unsupported_reason ==
        "the template matches none of the formats Switchyard renders");
}

// ---------------------------------------------------------------------------------------------
// --chat-template

TEST_CASE("chat template option: a name, a Jinja file, or a clear error") {
  CHECK(chat_template::read_option("llama3") == "llama3");
  CHECK(chat_template::parse(chat_template::read_option("mistral-v7-tekken")).format == chat_format::mistral_v7_tekken);

  const std::string gemma = template_source("gemma-2-it.jinja");
  temp_file file("gemma.jinja", gemma);
  const std::string spec = chat_template::read_option(file.path.string());
  CHECK(spec == gemma);  // the file's text: what a worker sends routers
  CHECK(chat_template::parse(spec).format == chat_format::gemma);

  temp_file smol("smollm2.jinja", template_source("smollm2-instruct.jinja"));
  CHECK(chat_template::parse(chat_template::read_option(smol.path.string())).default_system ==
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face");

  CHECK_THROWS_AS(chat_template::read_option("llama-3"), std::invalid_argument);
  CHECK_THROWS_WITH(chat_template::read_option("llama-3"),
                    Contains("'llama-3' is neither a chat format name nor a readable Jinja file") &&
                        Contains("chatml, llama3, llama2, llama2-sys") && Contains("gemma"));
  temp_file empty("empty.jinja");
  CHECK_THROWS_WITH(chat_template::read_option(empty.path.string()), Contains("the file is empty"));
  temp_file glmedge("zephyr.jinja", template_source("zephyr-7b-beta.jinja"));
  CHECK_THROWS_WITH(chat_template::read_option(glmedge.path.string()),
                    Contains("'glmedge' format") && Contains("pass one of the names instead") && Contains("chatml"));
}

TEST_CASE("chat template: an unsupported template is a state, and apply says why") {
  const chat_template t = chat_template::parse(template_source("role-colon.jinja"));
  CHECK(t.format == chat_format::unsupported);
  CHECK_FALSE(t.supported());
  CHECK_THAT(t.unsupported_reason, Contains("matches none of the formats Switchyard renders"));
  CHECK_THROWS_AS(t.apply({{"user", "hi"}}), std::runtime_error);
  CHECK_THROWS_WITH(t.apply({{"user", "hi"}}), Contains("the chat template cannot be applied"));
}

// ---------------------------------------------------------------------------------------------
// Worker: loading and the welcome

namespace {

// The model file with its `tokenizer.chat_template` overwritten in place (same length) by a
// template no rule recognises.
std::string with_unrecognised_template() {
  std::string bytes = read_text(sy::test::model_path());
  const std::string key = "tokenizer.chat_template";
  const size_t at = bytes.find(key);
  REQUIRE(at != std::string::npos);
  size_t p = at + key.size();
  uint32_t type = 0;
  uint64_t len = 0;
  std::memcpy(&type, bytes.data() + p, 4);
  std::memcpy(&len, bytes.data() + p + 4, 8);
  REQUIRE(type == static_cast<uint32_t>(sy::gguf::value_type::string));
  p += 12;
  const std::string replacement = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}";
  REQUIRE(len >= replacement.size());
  bytes.replace(p, len, replacement + std::string(len - replacement.size(), ' '));
  return bytes;
}

}  // namespace

TEST_CASE("a model whose chat template cannot be applied loads and serves completions") {
  REQUIRE_MODEL();
  temp_file file("unsupported_template.gguf", with_unrecognised_template());
  sy::cpu::thread_pool pool(1);
  std::unique_ptr<sy::llama_model> m;
  REQUIRE_NOTHROW(m = sy::llama_model::load(file.path.string(), pool));
  CHECK_FALSE(m->chat().supported());
  CHECK_THAT(m->chat().unsupported_reason, Contains("matches none of the formats"));
  CHECK_THROWS_WITH(m->chat().apply({{"user", "hi"}}), Contains("cannot be applied"));
  CHECK(m->vocab().encode("The capital of France is") ==
        sy::test::env()->model->vocab().encode("The capital of France is"));

  // What its worker sends routers: the source as it is; a router parses it the same way.
  const sy::proto::tokenizer_spec spec = sy::tokenizer_spec_from(m->file());
  CHECK_THAT(spec.chat_template, Contains("{{ m['role'] }}: {{ m['content'] }}"));
  CHECK_FALSE(chat_template::parse(spec.chat_template).supported());
}

TEST_CASE("a worker's welcome carries --chat-template in place of the model's template") {
  REQUIRE_MODEL();
  const sy::llama_model& model = *sy::test::env()->model;
  auto welcome_template = [&](const std::string& chat_override) {
    sy::engine_config cfg;
    cfg.n_kv_blocks = 8;
    sy::engine eng(
        model, std::make_unique<sy::cpu_backend>(model, sy::test::env()->pool, 8, 16, sy::cpu::kv_type::f16, 128), cfg);
    sy::service_config sc;
    sc.chat_template = chat_override;
    sy::worker_service w(eng, sc);
    std::vector<sy::out_frame> out;
    sy::proto::hello h;
    h.router_id = "r";
    w.on_frame("peer", std::string(sy::proto::name(sy::proto::msg_type::hello)), sy::proto::encode(h), 1000, out);
    for (const auto& f : out) {
      if (f.type != sy::proto::name(sy::proto::msg_type::welcome)) continue;
      const auto r = sy::proto::decode(f.type, f.body);
      REQUIRE(r.ok());
      return r.get_if<sy::proto::welcome>()->tokenizer.chat_template;
    }
    FAIL("no welcome");
    return std::string();
  };
  const std::string own = welcome_template("");
  CHECK_THAT(own, Contains("<|im_start|>"));  // the model's Jinja source
  CHECK(chat_template::parse(own).default_system == model.chat().default_system);
  const std::string named = welcome_template("llama3");
  CHECK(named == "llama3");
  CHECK(chat_template::parse(named).format == chat_format::llama3);
}
