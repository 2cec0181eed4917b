// Reasoning output (router/openai/reasoning.hpp): the splitter of `<think>...</think>` text, whole and
// fed in every chunking (a tag cut anywhere, thinking never closed, no tags, thinking opened by
// the prompt); which requests split (the parser flag, the template, enable_thinking); the tokens
// counted as reasoning; the response, chunk, usage and Anthropic shapes; tool calls after the
// thinking; the cache entry's count.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "cache/stored_response.hpp"
#include "common/tokenizer/chat_template.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "router/fleet/model_registry.hpp"
#include "router/openai/anthropic_api.hpp"
#include "router/openai/openai_request.hpp"
#include "router/openai/openai_response.hpp"
#include "router/openai/reasoning.hpp"
#include "tests/unit/sse_events.hpp"
#include "tiny_vocab.hpp"

using nlohmann::json;
using sy::router::reasoning_spec;
using sy::router::reasoning_splitter;
using sy::router::split_reasoning;
namespace router = sy::router;

namespace {

constexpr reasoning_spec k_closed{false};  // the output may open thinking itself (Qwen3)
constexpr reasoning_spec k_open{true};     // the prompt opened it (DeepSeek-R1 distills)

struct fed {
  std::string reasoning, content;
  bool reasoned = false;
};

// The text fed in the given pieces, the last one with done.
fed feed_pieces(const reasoning_spec& spec, const std::vector<std::string>& pieces) {
  reasoning_splitter s(spec);
  fed out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto d = s.feed(pieces[i], i + 1 == pieces.size());
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  out.reasoned = s.reasoned();
  return out;
}

// Every way to cut `text` in up to three pieces, and random cuts into many, give the whole split.
void check_every_chunking(const reasoning_spec& spec, const std::string& text) {
  const auto whole = split_reasoning(spec, text);
  INFO("text: " << text);
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); ++b) {
      const fed f = feed_pieces(spec, {text.substr(0, a), text.substr(a, b - a), text.substr(b)});
      INFO("cuts at " << a << ", " << b);
      REQUIRE(f.reasoning == whole.reasoning);
      REQUIRE(f.content == whole.content);
      REQUIRE(f.reasoned == whole.reasoned);
    }
  }
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(0, 4)(rng);
      pieces.push_back(text.substr(at, n));
      at += n;
    }
    pieces.emplace_back();  // the choice's last frame may carry no text
    const fed f = feed_pieces(spec, pieces);
    REQUIRE(f.reasoning == whole.reasoning);
    REQUIRE(f.content == whole.content);
  }
}

sy::proto::tokenizer_spec vocab_with_tags() {
  sy::proto::tokenizer_spec s = sy::test::tiny_vocab();
  for (const char* tag : {"<think>", "</think>"}) {
    s.tokens.emplace_back(tag);
    s.token_types.push_back(4);  // user-defined: rendered as text, as Qwen3's and the distills' are
  }
  return s;
}

}  // namespace

TEST_CASE("reasoning: whole texts split as the rule says", "[reasoning]") {
  SECTION("no tags: all content, no reasoning") {
    const auto r = split_reasoning(k_closed, "  Hello there.");
    CHECK(r.content == "  Hello there.");
    CHECK(r.reasoning.empty());
    CHECK_FALSE(r.reasoned);
  }
  SECTION("the model opens thinking (Qwen3)") {
    const auto r = split_reasoning(k_closed, "<think>\nLet me see.\n</think>\n\nThe answer is 4.");
    CHECK(r.reasoning == "\nLet me see.\n");
    CHECK(r.content == "The answer is 4.");
    CHECK(r.reasoned);
  }
  SECTION("whitespace before the opening tag is dropped with it") {
    CHECK(split_reasoning(k_closed, "\n <think>a</think>b").reasoning == "a");
  }
  SECTION("the prompt opened it: only </think> appears (DeepSeek-R1 distills)") {
    const auto r = split_reasoning(k_open, "Let me see.\n</think>\n\nFour.");
    CHECK(r.reasoning == "Let me see.\n");
    CHECK(r.content == "Four.");
  }
  SECTION("an opening tag the model repeats after the prompt's is dropped") {
    CHECK(split_reasoning(k_open, "x<think>y</think>z").reasoning == "x<think>y");
  }
  SECTION("thinking never closed (max_tokens): all reasoning, no content") {
    const auto r = split_reasoning(k_closed, "<think>I wonder whether</th");
    CHECK(r.reasoning == "I wonder whether</th");
    CHECK(r.content.empty());
    CHECK(r.reasoned);
    const auto o = split_reasoning(k_open, "I wonder");
    CHECK(o.reasoning == "I wonder");
    CHECK(o.content.empty());
  }
  SECTION("the prompt opened it and nothing came: reasoned, both empty") {
    const auto r = split_reasoning(k_open, "");
    CHECK(r.reasoned);
    CHECK(r.reasoning.empty());
    CHECK(r.content.empty());
  }
  SECTION("tags later in the text, or not at the start, are content") {
    CHECK(split_reasoning(k_closed, "Sure. <think>x</think>").content == "Sure. <think>x</think>");
    CHECK(split_reasoning(k_closed, "<think>a</think>b<think>c</think>").content == "b<think>c</think>");
    CHECK(split_reasoning(k_closed, "<thinking>x").content == "<thinking>x");
    CHECK(split_reasoning(k_closed, "<thi").content == "<thi");
  }
}

TEST_CASE("reasoning: any chunking adds up to the whole-text split", "[reasoning]") {
  for (const auto& spec : {k_closed, k_open}) {
    check_every_chunking(spec, "<think>\nab</think>\n\ncd");
    check_every_chunking(spec, "  <think>a</thi</think>  \n");
    check_every_chunking(spec, "ab</think>cd</think>");
    check_every_chunking(spec, "plain text, no tags <");
    check_every_chunking(spec, "<think>never closed </thin");
    check_every_chunking(spec, "<thin");
    check_every_chunking(spec, "   ");
  }
}

TEST_CASE("reasoning: a </think> split over pieces never leaks into either part", "[reasoning]") {
  reasoning_splitter s(k_open);
  auto d = s.feed("thinking</", false);
  CHECK(d.reasoning == "thinking");  // the possible start of the tag is held
  d = s.feed("thi", false);
  CHECK(d.reasoning.empty());
  d = s.feed("nk>", false);
  CHECK(d.reasoning.empty());
  CHECK(d.content.empty());
  d = s.feed("\n\n", false);  // whitespace after the tag: dropped
  CHECK(d.content.empty());
  d = s.feed("Answer", true);
  CHECK(d.content == "Answer");
}

TEST_CASE("reasoning: the prompt opens thinking when its last <think> is still open", "[reasoning]") {
  CHECK(router::prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
  CHECK(router::prompt_opens_thinking("<｜Assistant｜><think>"));
  CHECK_FALSE(router::prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));  // enable_thinking off
  CHECK(router::prompt_closes_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  CHECK(router::prompt_closes_thinking("<｜Assistant｜></think>"));  // DeepSeek-V3.1, thinking off
  CHECK_FALSE(router::prompt_closes_thinking("<｜Assistant｜><think>"));
  CHECK_FALSE(router::prompt_closes_thinking("</think> answer"));
  CHECK_FALSE(router::prompt_closes_thinking("no tags"));
  CHECK_FALSE(router::prompt_opens_thinking("<|im_start|>assistant\n"));
  CHECK_FALSE(router::prompt_opens_thinking("<think>\nx"));
  const sy::tokenizer tok = sy::tokenizer::from_spec(sy::test::tiny_vocab());
  CHECK(router::prompt_opens_thinking(tok, tok.encode("<|im_start|>assistant\n<think>\n")));
  CHECK_FALSE(router::prompt_opens_thinking(tok, tok.encode("<|im_start|>assistant\n")));
}

TEST_CASE("reasoning: reasoning_tokens counts the tokens inside the thinking", "[reasoning]") {
  SECTION("tags spelled in several tokens (byte-level tokens)") {
    const sy::tokenizer tok = sy::tokenizer::from_spec(sy::test::tiny_vocab());
    const auto ids = tok.encode("<think>abc</think>de");
    CHECK(router::count_reasoning_tokens(tok, k_closed, ids) == tok.encode("abc").size());
    CHECK(router::count_reasoning_tokens(tok, k_closed, tok.encode("no thinking")) == 0);
    const auto cut = tok.encode("<think>abc");  // never closed
    CHECK(router::count_reasoning_tokens(tok, k_closed, cut) == 3);
    CHECK(router::count_reasoning_tokens(tok, k_open, tok.encode("ab</think>c")) == 2);
    // So far (a stream's usage): a token that may begin </think> waits, so the count never falls.
    const auto ids_so_far = tok.encode("<think>abc</th");
    CHECK(router::count_reasoning_tokens(tok, k_closed, ids_so_far, /*done=*/false) == 3);
    CHECK(router::count_reasoning_tokens(tok, k_closed, ids_so_far, /*done=*/true) == ids_so_far.size() - 7);
    uint32_t last = 0;
    std::vector<int32_t> grown;
    for (const int32_t t : ids) {
      grown.push_back(t);
      const uint32_t n = router::count_reasoning_tokens(tok, k_closed, grown, /*done=*/false);
      CHECK(n >= last);
      last = n;
    }
    CHECK(last == router::count_reasoning_tokens(tok, k_closed, ids));
  }
  SECTION("tags as single tokens, the end of generation after the answer") {
    const sy::tokenizer tok = sy::tokenizer::from_spec(vocab_with_tags());
    const int32_t open = tok.find("<think>"), close = tok.find("</think>");
    REQUIRE(open >= 0);
    REQUIRE(close >= 0);
    std::vector<int32_t> ids = {open};
    for (const int32_t t : tok.encode("\nab")) ids.push_back(t);
    ids.push_back(close);
    for (const int32_t t : tok.encode("\n\nHi")) ids.push_back(t);
    ids.push_back(tok.eos());
    CHECK(router::count_reasoning_tokens(tok, k_closed, ids) == tok.encode("\nab").size());
    // The text the worker streams of these ids splits the same way.
    const auto r = split_reasoning(k_closed, tok.decode(ids));
    CHECK(r.reasoning == "\nab");
    CHECK(r.content == "Hi");
  }
}

TEST_CASE("reasoning: which chat requests split", "[reasoning]") {
  const auto entry = [](const std::string& tmpl) {
    sy::proto::tokenizer_spec spec = sy::test::tiny_vocab();
    spec.chat_template = tmpl;  // as a worker's welcome carries it
    return router::model_entry{.id = "m",
                               .context_length = 4096,
                               .created = 0,
                               .tok = sy::tokenizer::from_spec(spec),
                               .tmpl = sy::chat_template::parse(tmpl),
                               .spec = spec};
  };
  const std::string qwen3 =
      "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endfor %}"
      "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- if enable_thinking is defined and enable_thinking "
      "is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}";
  const router::model_entry thinker = entry(qwen3), plain = entry("chatml");
  REQUIRE(thinker.tmpl.thinking_switch);
  const std::vector<sy::chat_message> msgs = {{"user", "hi"}};
  const auto prompt = [&](const router::model_entry& m, bool think) { return m.chat_prompt(msgs, true, {}, think); };
  using router::reasoning_parser;
  const auto of = [](reasoning_parser p, const router::model_entry& m, const std::vector<int32_t>& prompt, bool think) {
    return router::reasoning_of(p, m.spec.chat_template, m.tok, prompt, think);
  };

  // auto: by the template.
  auto s = of(reasoning_parser::automatic, thinker, prompt(thinker, true), true);
  REQUIRE(s);
  CHECK_FALSE(s->open);
  CHECK_FALSE(of(reasoning_parser::automatic, plain, prompt(plain, true), true));
  // enable_thinking false: the template writes an empty block, the answer is all content.
  CHECK_FALSE(of(reasoning_parser::automatic, thinker, prompt(thinker, false), false));
  // Forced on for every model; deepseek_r1 assumes the thinking is open from the first byte.
  s = of(reasoning_parser::qwen3, plain, prompt(plain, true), true);
  REQUIRE(s);
  CHECK_FALSE(s->open);
  s = of(reasoning_parser::deepseek_r1, plain, prompt(plain, true), true);
  REQUIRE(s);
  CHECK(s->open);
  CHECK_FALSE(of(reasoning_parser::none, thinker, prompt(thinker, true), true));
  // A prompt that ends in an open <think> opens it, whatever enable_thinking says.
  const std::vector<int32_t> opened = thinker.tok.encode("<|im_start|>assistant\n<think>\n");
  s = of(reasoning_parser::automatic, thinker, opened, false);
  REQUIRE(s);
  CHECK(s->open);
  // DeepSeek-R1's template (deepseek3): auto splits, open from the first byte, because the
  // generation prompt it renders ends in <think>\n. The first R1 template, whose prompt does not
  // open it and which mentions only </think>, splits too, open where the output opens it.
  const std::string r1_markers =
      "{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}{% set content = "
      "message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif "
      "%}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}";
  const router::model_entry r1 = entry(r1_markers + "{{'<｜Assistant｜><think>\\n'}}");
  const router::model_entry r1_first = entry(r1_markers + "{{'<｜Assistant｜>'}}");
  REQUIRE(r1.tmpl.opens_thinking);
  REQUIRE_FALSE(r1_first.tmpl.opens_thinking);
  s = of(reasoning_parser::automatic, r1, prompt(r1, true), true);
  REQUIRE(s);
  CHECK(s->open);
  s = of(reasoning_parser::automatic, r1_first, prompt(r1_first, true), true);
  REQUIRE(s);
  CHECK_FALSE(s->open);
  // DeepSeek-V3.1's template: `thinking` on, the prompt ends in <think> and the answer splits
  // open from the first byte; off or not given (its default), the prompt ends in </think> and
  // nothing splits, under deepseek_r1 too (the prompt closed the thinking).
  const std::string v31_src =
      "{% if not thinking is defined %}{% set thinking = false %}{% endif %}{%- for message in messages "
      "%}{{'<｜User｜>' "
      "+ message['content']}}{%- if message['prefix'] is defined and message['prefix'] and thinking %}{{'<think>'}}"
      "{%- endif %}{{'<｜end▁of▁sentence｜>'}}{%- endfor %}{{'<｜Assistant｜>'}}{%- if not thinking %}{{'</think>'}}"
      "{%- else %}{{'<think>'}}{%- endif %}";
  const router::model_entry v31 = entry(v31_src);
  REQUIRE(v31.tmpl.thinking_switch);
  const auto v31_prompt = [&](std::optional<bool> think) { return v31.chat_prompt(msgs, true, {}, think); };
  const auto v31_of = [&](reasoning_parser p, std::optional<bool> think) {
    return router::reasoning_of(p, v31.spec.chat_template, v31.tok, v31_prompt(think), think);
  };
  s = v31_of(reasoning_parser::automatic, true);
  REQUIRE(s);
  CHECK(s->open);
  CHECK_FALSE(v31_of(reasoning_parser::automatic, false));
  CHECK_FALSE(v31_of(reasoning_parser::automatic, std::nullopt));
  CHECK_FALSE(v31_of(reasoning_parser::deepseek_r1, std::nullopt));
  CHECK_FALSE(v31_of(reasoning_parser::qwen3, false));
  s = v31_of(reasoning_parser::deepseek_r1, true);
  REQUIRE(s);
  CHECK(s->open);

  // The switch reaches the template from chat_template_kwargs or the top-level simple form.
  const auto parse = [](const std::string& extra) {
    auto v = router::parse_generation_request(
        router::endpoint::chat_completions, R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + extra + "}",
        {});
    REQUIRE(std::holds_alternative<router::generation_request>(v));
    return std::get<router::generation_request>(v).thinking;
  };
  CHECK_FALSE(parse("").has_value());
  CHECK(parse(R"(,"chat_template_kwargs":{"enable_thinking":false})") == false);
  CHECK(parse(R"(,"enable_thinking":false)") == false);
  CHECK(parse(R"(,"enable_thinking":false,"chat_template_kwargs":{"enable_thinking":true})") == true);
  CHECK(parse(R"(,"enable_thinking":false,"chat_template_kwargs":{"thinking":true})") == true);
}

namespace {

router::response_meta chat_meta(reasoning_spec spec) {
  router::response_meta meta;
  meta.id = "chatcmpl-1";
  meta.model = "m";
  meta.kind = router::endpoint::chat_completions;
  router::enable_reasoning(meta, spec);
  return meta;
}

}  // namespace

TEST_CASE("reasoning: responses carry reasoning_content and reasoning, never in content", "[reasoning]") {
  const router::response_meta meta = chat_meta(k_closed);
  router::usage_info u{10, 12, 0};
  u.reasoning_tokens = 7;
  const json j = json::parse(
      router::format_response(meta, {{0, "<think>\nhmm\n</think>\n\nFour.", sy::finish_reason::stop, {}}}, u));
  const json& msg = j["choices"][0]["message"];
  CHECK(msg["content"] == "Four.");
  CHECK(msg["reasoning_content"] == "\nhmm\n");
  CHECK(msg["reasoning"] == "\nhmm\n");
  CHECK(j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 7);

  // Cut while thinking: all reasoning, content null, finish_reason length.
  const json cut =
      json::parse(router::format_response(meta, {{0, "<think>still going", sy::finish_reason::length, {}}}, u));
  CHECK(cut["choices"][0]["message"]["content"].is_null());
  CHECK(cut["choices"][0]["message"]["reasoning_content"] == "still going");
  CHECK(cut["choices"][0]["finish_reason"] == "length");

  // No tags: content as written, reasoning null.
  const json none = json::parse(router::format_response(meta, {{0, "Just four.", sy::finish_reason::stop, {}}}, u));
  CHECK(none["choices"][0]["message"]["content"] == "Just four.");
  CHECK(none["choices"][0]["message"]["reasoning_content"].is_null());

  // Without the parser nothing changes: no reasoning fields, no details.
  router::response_meta off = meta;
  off.reasoning.reset();
  const json raw =
      json::parse(router::format_response(off, {{0, "<think>x</think>y", sy::finish_reason::stop, {}}}, {10, 12, 0}));
  CHECK(raw["choices"][0]["message"]["content"] == "<think>x</think>y");
  CHECK_FALSE(raw["choices"][0]["message"].contains("reasoning_content"));
  CHECK_FALSE(raw["usage"].contains("completion_tokens_details"));
}

TEST_CASE("reasoning: streamed chunks put reasoning deltas first, content only after </think>", "[reasoning]") {
  const std::string text = "ab</think>\n\nAnswer.";  // the prompt opened the thinking
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const router::response_meta meta = chat_meta(k_open);
    std::string reasoning, reasoning2, content;
    bool content_seen = false, reasoning_after_content = false;
    const std::vector<std::string> pieces = {text.substr(0, cut), text.substr(cut), ""};
    for (size_t i = 0; i < pieces.size(); ++i) {
      const bool last = i + 1 == pieces.size();
      const json c = json::parse(router::format_chunk(meta, 0, pieces[i], i == 0,
                                                      last ? sy::finish_reason::stop : sy::finish_reason::none, {}));
      const json& d = c["choices"][0]["delta"];
      if (d.contains("reasoning_content")) {
        reasoning += d["reasoning_content"].get<std::string>();
        reasoning2 += d["reasoning"].get<std::string>();
        reasoning_after_content = reasoning_after_content || content_seen;
      }
      if (d.contains("content")) {
        content += d["content"].get<std::string>();
        content_seen = true;
      }
    }
    INFO("cut at " << cut);
    CHECK(reasoning == "ab");
    CHECK(reasoning2 == "ab");
    CHECK(content == "Answer.");
    CHECK_FALSE(reasoning_after_content);
  }
}

TEST_CASE("reasoning: tool calls after the thinking still parse, whole and streamed", "[reasoning]") {
  auto parsed = router::parse_generation_request(
      router::endpoint::chat_completions,
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":
          {"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}}}}}]})",
      {});
  REQUIRE(std::holds_alternative<router::generation_request>(parsed));
  const auto& g = std::get<router::generation_request>(parsed);
  const std::string text =
      "<think>The user wants <tool_call> the time.</think>\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
      "{\"zone\": \"UTC\"}}\n</tool_call>";
  const auto meta_for = [&] {
    router::response_meta meta = chat_meta(k_closed);
    router::enable_tool_calls(meta, g, sy::chat_format::chatml);
    return meta;
  };
  const json j = json::parse(router::format_response(meta_for(), {{0, text, sy::finish_reason::stop, {}}}, {}));
  const json& msg = j["choices"][0]["message"];
  CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(msg["reasoning_content"] == "The user wants <tool_call> the time.");
  REQUIRE(msg["tool_calls"].size() == 1);
  CHECK(msg["tool_calls"][0]["function"]["name"] == "get_time");
  CHECK(msg["content"].is_null());

  const router::response_meta meta = meta_for();
  std::string reasoning, args, name;
  std::string finish;
  for (size_t at = 0; at < text.size(); at += 5) {
    const bool last = at + 5 >= text.size();
    const json c = json::parse(router::format_chunk(meta, 0, text.substr(at, 5), at == 0,
                                                    last ? sy::finish_reason::stop : sy::finish_reason::none, {}));
    const json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) {
      if (d["tool_calls"][0]["function"].contains("name")) name = d["tool_calls"][0]["function"]["name"];
      args += d["tool_calls"][0]["function"]["arguments"].get<std::string>();
    }
    if (last) finish = c["choices"][0]["finish_reason"];
  }
  CHECK(reasoning == "The user wants <tool_call> the time.");
  CHECK(name == "get_time");
  CHECK(json::parse(args) == json{{"zone", "UTC"}});
  CHECK(finish == "tool_calls");
}

TEST_CASE("reasoning: the Anthropic route answers with a thinking block before the text", "[reasoning]") {
  const auto parsed = router::parse_anthropic_request(
      R"({"model":"m","max_tokens":16,"messages":[{"role":"user","content":"x"}]})", {});
  REQUIRE(std::holds_alternative<router::generation_request>(parsed));
  const auto& g = std::get<router::generation_request>(parsed);
  const auto meta_for = [&] {
    router::response_meta meta = chat_meta(k_open);
    meta.id = "msg_1";
    router::enable_anthropic(meta, g, 3);
    return meta;
  };
  router::choice_result c;
  c.text = "hmm</think>\n\nHello";
  c.finish_reason = sy::finish_reason::stop;
  const json j = json::parse(router::format_response(meta_for(), {c}, {3, 5, 0}));
  REQUIRE(j["content"].size() == 2);
  CHECK(j["content"][0]["type"] == "thinking");
  CHECK(j["content"][0]["thinking"] == "hmm");
  CHECK(j["content"][1] == json{{"type", "text"}, {"text", "Hello"}});

  const router::response_meta meta = meta_for();
  std::string out;
  for (const auto& [piece, finish] :
       std::vector<std::pair<std::string, sy::finish_reason>>{{"hm", sy::finish_reason::none},
                                                              {"m</th", sy::finish_reason::none},
                                                              {"ink>\n\nHel", sy::finish_reason::none},
                                                              {"lo", sy::finish_reason::stop}})
    out += router::format_chunk(meta, 0, piece, false, finish, {}) + "\n\n";
  CHECK(out.find(R"("content_block":{"type":"thinking")") != std::string::npos);
  CHECK(out.find(R"({"type":"thinking_delta","thinking":"hm"})") != std::string::npos);
  CHECK(out.find(R"("content_block":{"type":"text")") != std::string::npos);
  CHECK(out.find("</think>") == std::string::npos);
  CHECK(out.find(R"({"type":"text_delta","text":"Hel"})") != std::string::npos);
  // The events in Anthropic's order: the thinking block's deltas, its signature, its end, then the
  // text block.
  out += router::format_stream_end(meta, {3, 5, 0}, false).front();
  std::vector<std::string> seq;
  for (const auto& [name, data] : sy::test::named_events(out)) {
    if (name == "content_block_start") seq.push_back("start " + data["content_block"]["type"].get<std::string>());
    if (name == "content_block_delta")
      seq.push_back(data["delta"]["type"].get<std::string>() + " " + std::to_string(data["index"].get<int>()));
    if (name == "content_block_stop") seq.push_back("stop " + std::to_string(data["index"].get<int>()));
    if (name == "content_block_delta" && data["delta"]["type"] == "signature_delta")
      CHECK(data["delta"]["signature"] == "");
  }
  CHECK(seq == std::vector<std::string>{"start thinking", "thinking_delta 0", "thinking_delta 0", "signature_delta 0",
                                        "stop 0", "start text", "text_delta 1", "text_delta 1", "stop 1"});
  // Cut by max_tokens while thinking: the thinking block still ends with its signature.
  const router::response_meta cut = meta_for();
  std::string cut_out = router::format_chunk(cut, 0, "hmm", true, sy::finish_reason::length, {});
  cut_out += "\n\n" + router::format_stream_end(cut, {3, 1, 0}, false).front();
  std::vector<std::string> cut_names;
  for (const auto& [name, data] : sy::test::named_events(cut_out))
    cut_names.push_back(name == "content_block_delta" ? data["delta"]["type"].get<std::string>() : name);
  CHECK(cut_names == std::vector<std::string>{"message_start", "content_block_start", "thinking_delta",
                                              "signature_delta", "content_block_stop", "message_delta",
                                              "message_stop"});
  // {"type": "disabled"} switches thinking off where the template can, {"type": "enabled"} on.
  const auto off = router::parse_anthropic_request(
      R"({"model":"m","max_tokens":16,"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"x"}]})", {});
  REQUIRE(std::holds_alternative<router::generation_request>(off));
  CHECK(std::get<router::generation_request>(off).thinking == false);
  const auto on = router::parse_anthropic_request(
      R"({"model":"m","max_tokens":4096,"thinking":{"type":"enabled","budget_tokens":1024},
          "messages":[{"role":"user","content":"x"}]})",
      {});
  REQUIRE(std::holds_alternative<router::generation_request>(on));
  CHECK(std::get<router::generation_request>(on).thinking == true);
}

TEST_CASE("reasoning: a cache entry keeps the reasoning token count", "[reasoning]") {
  sy::cache::stored_response r;
  r.endpoint = 1;
  r.model = "m";
  r.choices.push_back({{"<think>a", "b</think>c"}, sy::finish_reason::stop, "", ""});
  r.prompt_tokens = 4;
  r.completion_tokens = 6;
  r.reasoning_tokens = 3;
  const std::string v3 = sy::cache::encode(r);
  const auto back = sy::cache::decode(v3);
  REQUIRE(back);
  CHECK(*back == r);
  CHECK(back->reasoning_tokens == 3);

  // Older entries still read. Version 2: without each choice's stop string (here the one
  // choice's empty string, its last 4 bytes before the checksum).
  const auto seal = [](std::string body, char version) {
    body[4] = version;
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a-64 of every byte before it, little-endian
    for (const unsigned char ch : body) h = (h ^ ch) * 0x100000001b3ull;
    for (int i = 0; i < 8; ++i) body += static_cast<char>((h >> (8 * i)) & 0xff);
    return body;
  };
  const std::string v2_body = v3.substr(0, v3.size() - 8 - 4);
  const auto v2 = sy::cache::decode(seal(v2_body, 2));
  REQUIRE(v2);
  CHECK(*v2 == r);
  // Version 1: no reasoning_tokens field either; it reads as 0.
  const size_t at = 4 + 1 + 1 + 4 + r.model.size() + 3 * 4;  // "SYRC", version, endpoint, model, 3 counts
  const auto old = sy::cache::decode(seal(v2_body.substr(0, at) + v2_body.substr(at + 4), 1));
  REQUIRE(old);
  CHECK(old->reasoning_tokens == 0);
  CHECK(old->choices == r.choices);
  CHECK(old->completion_tokens == 6);
}
