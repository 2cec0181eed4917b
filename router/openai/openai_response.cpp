// Formatting of the OpenAI-compatible API's responses (see openai_response.hpp).
//
// Every JSON text is dumped with the "replace" error handler, so formatting never throws on a
// token text that ends in the middle of a UTF-8 character.
#include "router/openai/openai_response.hpp"

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/utf8.hpp"
#include "router/openai/anthropic_api.hpp"
#include "router/openai/api_errors.hpp"
#include "router/openai/responses_api.hpp"

namespace sy::router {

namespace {

// Output objects keep insertion order, so bodies read in OpenAI's order ("id" first).
using ordered_json = nlohmann::ordered_json;
using text::valid_utf8;  // every string a response carries is valid UTF-8 (common/utf8.hpp)

// ---- Formatting helpers --------------------------------------------------------------------------

std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

// A log-probability as JSON: the float's shortest decimal form; -inf, NaN and anything below
// -9999 become -9999 (JSON has no infinity; vLLM clamps the same way).
double logprob_value(float lp) {
  if (!std::isfinite(lp) || lp < -9999.f) return -9999.0;
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, lp);
  double d = lp;
  std::from_chars(buf, res.ptr, d);
  return d;
}

ordered_json envelope(const response_meta& meta, const char* object) {
  ordered_json j = ordered_json::object();
  j["id"] = meta.id;
  j["object"] = object;
  j["created"] = meta.created;
  j["model"] = meta.model;
  return j;
}

ordered_json usage_json(const usage_info& u) {
  ordered_json j = ordered_json::object();
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = static_cast<uint64_t>(u.prompt_tokens) + u.completion_tokens;
  j["prompt_tokens_details"] = ordered_json{{"cached_tokens", u.cached_tokens}};
  if (u.reasoning_tokens) j["completion_tokens_details"] = ordered_json{{"reasoning_tokens", *u.reasoning_tokens}};
  return j;
}

// A message's reasoning under both names: `reasoning_content` (the first servers' name, which
// clients read) and `reasoning` (vLLM's newer one); null when the model did not think.
void add_reasoning(ordered_json& message, const reasoning_split& r) {
  const ordered_json v = r.reasoned ? ordered_json(r.reasoning) : ordered_json(nullptr);
  message["reasoning_content"] = v;
  message["reasoning"] = v;
}
// A stream delta's reasoning, when this piece has some.
void add_reasoning(ordered_json& delta, const std::string& reasoning) {
  if (reasoning.empty()) return;
  delta["reasoning_content"] = reasoning;
  delta["reasoning"] = reasoning;
}

// The one place a finish reason becomes JSON: null while none, else its name.
ordered_json finish_json(finish_reason r) {
  return r == finish_reason::none ? ordered_json(nullptr) : ordered_json(std::string(name(r)));
}

// vLLM's choice.stop_reason: the stop string that ended a choice that ended with "stop" on one,
// else null (the end of the turn, a grammar's end, max_tokens).
ordered_json stop_reason_json(finish_reason r, std::string_view stop) {
  return r == finish_reason::stop && !stop.empty() ? ordered_json(std::string(stop)) : ordered_json(nullptr);
}

// Legacy completions shape; text_offset counts bytes from the start of these tokens' text.
ordered_json completion_logprobs(const std::vector<token_logprobs>& lps) {
  ordered_json tokens = ordered_json::array(), token_logprobs = ordered_json::array(),
               top_logprobs = ordered_json::array();
  ordered_json text_offset = ordered_json::array();
  size_t offset = 0;
  for (const auto& t : lps) {
    tokens.push_back(valid_utf8(t.token));
    token_logprobs.push_back(logprob_value(t.logprob));
    ordered_json alternatives = ordered_json::object();
    for (const auto& [text, lp] : t.top) {
      // Keys are made valid UTF-8 first so two broken texts cannot collide after dumping;
      // the first (most likely) one wins.
      alternatives.emplace(valid_utf8(text), logprob_value(lp));
    }
    top_logprobs.push_back(std::move(alternatives));
    text_offset.push_back(offset);
    offset += t.token.size();
  }
  ordered_json j = ordered_json::object();
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(token_logprobs);
  j["top_logprobs"] = std::move(top_logprobs);
  j["text_offset"] = std::move(text_offset);
  return j;
}

ordered_json chat_token(const std::string& text, float lp) {
  ordered_json j = ordered_json::object();
  j["token"] = valid_utf8(text);
  j["logprob"] = logprob_value(lp);
  ordered_json bytes = ordered_json::array();
  for (const char c : text) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  j["bytes"] = std::move(bytes);
  return j;
}

// Chat shape: {"content": [{"token","logprob","bytes","top_logprobs":[...]}]}.
ordered_json chat_logprobs(const std::vector<token_logprobs>& lps) {
  return ordered_json{{"content", token_logprobs_json(lps)}};
}

ordered_json logprobs_json(const response_meta& meta, const std::vector<token_logprobs>& lps) {
  if (!meta.want_logprobs) return nullptr;
  return meta.kind == endpoint::completions ? completion_logprobs(lps) : chat_logprobs(lps);
}

// A message's tool call: {"id", "type": "function", "function": {"name", "arguments"}}.
ordered_json tool_call_json(const std::string& id, const parsed_tool_call& c) {
  ordered_json call = ordered_json::object();
  call["id"] = id;
  call["type"] = "function";
  call["function"] = ordered_json{{"name", c.name}, {"arguments", c.arguments}};
  return call;
}

}  // namespace

ordered_json token_logprobs_json(const std::vector<token_logprobs>& lps) {
  ordered_json content = ordered_json::array();
  for (const auto& t : lps) {
    ordered_json entry = chat_token(t.token, t.logprob);
    ordered_json top = ordered_json::array();
    for (const auto& [text, lp] : t.top) top.push_back(chat_token(text, lp));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return content;
}

std::string format_response(const response_meta& meta, const std::vector<choice_result>& choices,
                            const usage_info& usage) {
  if (meta.anthropic) return anthropic_response(meta, choices, usage);
  if (meta.responses) return responses_response(meta, choices, usage);
  const bool chat = meta.kind == endpoint::chat_completions;
  ordered_json j = envelope(meta, chat ? "chat.completion" : "text_completion");
  ordered_json out = ordered_json::array();
  for (const auto& c : choices) {
    ordered_json choice = ordered_json::object();
    choice["index"] = c.index;
    finish_reason finish = c.finish_reason;
    // Reasoning first: tool calls are parsed out of the content alone.
    std::optional<reasoning_split> thought;
    if (chat && meta.reasoning) thought = split_reasoning(*meta.reasoning, c.text);
    const std::string_view text = thought ? std::string_view(thought->content) : std::string_view(c.text);
    const bool null_if_empty = thought && thought->reasoned;  // vLLM: no answer after the thinking is null
    if (chat && meta.tools) {
      const tool_output parsed = parse_tool_output(*meta.tools, text);
      ordered_json message = ordered_json{{"role", "assistant"}};
      message["content"] = parsed.has_content && !(null_if_empty && parsed.content.empty())
                               ? ordered_json(parsed.content)
                               : ordered_json(nullptr);
      if (thought) add_reasoning(message, *thought);
      if (!parsed.calls.empty()) {
        ordered_json calls = ordered_json::array();
        for (size_t i = 0; i < parsed.calls.size(); ++i)
          calls.push_back(tool_call_json(tool_call_id(meta.id, c.index, i), parsed.calls[i]));
        message["tool_calls"] = std::move(calls);
        if (finish == finish_reason::stop) finish = finish_reason::tool_calls;
      }
      choice["message"] = std::move(message);
    } else if (chat) {
      ordered_json message = ordered_json{{"role", "assistant"}};
      message["content"] = null_if_empty && text.empty() ? ordered_json(nullptr) : ordered_json(std::string(text));
      if (thought) add_reasoning(message, *thought);
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = logprobs_json(meta, c.logprobs);
    choice["finish_reason"] = finish_json(finish);
    choice["stop_reason"] = stop_reason_json(c.finish_reason, c.stop);
    out.push_back(std::move(choice));
  }
  j["choices"] = std::move(out);
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string format_chunk(const response_meta& meta, int32_t index, std::string_view text, bool first,
                         finish_reason finish, const std::vector<token_logprobs>& logprobs, const usage_info* usage,
                         std::string_view stop) {
  const bool chat = meta.kind == endpoint::chat_completions;
  const finish_reason ended = finish;  // as the worker ended it (a call found makes `finish` tool_calls)
  // Reasoning first: what follows (content, tool calls) reads only the content part.
  reasoning_delta thought;
  if (chat && meta.reasoning && meta.reasoning_streams) {
    reasoning_splitter& sp = meta.reasoning_streams->try_emplace(index, *meta.reasoning).first->second;
    thought = sp.feed(text, finish != finish_reason::none);
    text = thought.content;
  }
  if (meta.anthropic) return anthropic_chunk(meta, text, finish, thought.reasoning);            // one choice: n is 1
  if (meta.responses) return responses_chunk(meta, text, finish, thought.reasoning, logprobs);  // n is 1 too
  ordered_json j = envelope(meta, chat ? "chat.completion.chunk" : "text_completion");
  ordered_json choice = ordered_json::object();
  choice["index"] = index;
  if (chat && meta.tools && meta.tool_streams) {
    tool_call_stream& st = meta.tool_streams->try_emplace(index, *meta.tools).first->second;
    const tool_stream_delta d = st.feed(text, finish != finish_reason::none);
    ordered_json delta = ordered_json::object();
    if (first) delta["role"] = "assistant";
    add_reasoning(delta, thought.reasoning);
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (const tool_call_delta& c : d.calls) {
        ordered_json call = ordered_json::object();
        call["index"] = c.index;
        ordered_json fn = ordered_json::object();
        if (c.first) {
          call["id"] = tool_call_id(meta.id, index, c.index);
          call["type"] = "function";
          fn["name"] = c.name;
        }
        fn["arguments"] = c.arguments;
        call["function"] = std::move(fn);
        calls.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = std::move(delta);
    if (finish == finish_reason::stop && st.called()) finish = finish_reason::tool_calls;
  } else if (chat) {
    ordered_json delta = ordered_json::object();
    if (first) delta["role"] = "assistant";
    add_reasoning(delta, thought.reasoning);
    if (!text.empty()) delta["content"] = std::string(text);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = std::string(text);
  }
  choice["logprobs"] = logprobs_json(meta, logprobs);
  choice["finish_reason"] = finish_json(finish);
  if (ended != finish_reason::none) choice["stop_reason"] = stop_reason_json(ended, stop);  // the last chunk's only
  j["choices"] = ordered_json::array({std::move(choice)});
  if (usage) j["usage"] = usage_json(*usage);
  return dump(j);
}

void enable_reasoning(response_meta& meta, reasoning_spec spec) {
  meta.reasoning = std::make_shared<const reasoning_spec>(spec);
  meta.reasoning_streams = std::make_shared<std::map<int32_t, reasoning_splitter>>();
}

void enable_tool_calls(response_meta& meta, const generation_request& g, chat_format f) {
  if (g.kind != endpoint::chat_completions || !g.tools.active()) return;
  meta.tools = std::make_shared<const tool_parse_spec>(make_parse_spec(g.tools, f));
  meta.tool_streams = std::make_shared<std::map<int32_t, tool_call_stream>>();
}

std::string format_usage_chunk(const response_meta& meta, const usage_info& usage) {
  ordered_json j =
      envelope(meta, meta.kind == endpoint::chat_completions ? "chat.completion.chunk" : "text_completion");
  j["choices"] = ordered_json::array();
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string format_error(const response_meta& meta, const api_error& e) {
  return format_error(meta.anthropic ? api_family::anthropic : api_family::openai, e);
}

namespace {

// `events` and then the SSE data that ends an OpenAI-shaped stream (chat, completions): the one
// place that writes [DONE].
std::vector<std::string> then_done(std::vector<std::string> events) {
  events.emplace_back("[DONE]");
  return events;
}

}  // namespace

std::vector<std::string> format_stream_end(const response_meta& meta, const usage_info& usage, bool include_usage) {
  if (meta.anthropic) return {anthropic_stream_end(meta, usage)};
  if (meta.responses) return {responses_stream_end(meta, usage)};
  std::vector<std::string> out;
  if (include_usage) out.push_back(format_usage_chunk(meta, usage));
  return then_done(std::move(out));
}

std::vector<std::string> format_stream_error(const response_meta& meta, const api_error& e) {
  if (meta.anthropic) return {anthropic_error_event(e)};
  if (meta.responses) return {responses_error_event(meta, e)};
  return then_done({format_error(e)});
}

namespace {

ordered_json model_json(const model_card& m) {
  ordered_json card = ordered_json::object();
  card["id"] = m.id;
  card["object"] = "model";
  card["created"] = m.created;
  card["owned_by"] = "switchyard";
  card["root"] = m.root;
  card["max_model_len"] = m.max_model_len;
  return card;
}

}  // namespace

std::string format_models(const std::vector<model_card>& models) {
  ordered_json data = ordered_json::array();
  for (const auto& m : models) data.push_back(model_json(m));
  ordered_json j = ordered_json::object();
  j["object"] = "list";
  j["data"] = std::move(data);
  return dump(j);
}

std::string format_model(const model_card& model) { return dump(model_json(model)); }

std::string format_version() { return dump(ordered_json{{"version", SY_VERSION}}); }

std::string format_tokenize(const std::vector<int32_t>& ids, uint32_t max_model_len,
                            const std::vector<std::string>& token_strs) {
  ordered_json j = ordered_json::object();
  j["count"] = ids.size();
  j["max_model_len"] = max_model_len;
  j["tokens"] = ids;
  if (!token_strs.empty()) {
    ordered_json strs = ordered_json::array();
    for (const auto& s : token_strs) strs.push_back(valid_utf8(s));
    j["token_strs"] = std::move(strs);
  }
  return dump(j);
}

std::string format_detokenize(std::string_view text) {
  const std::string valid = valid_utf8(text);
  return dump(ordered_json{{"prompt", valid}, {"content", valid}});
}

}  // namespace sy::router
