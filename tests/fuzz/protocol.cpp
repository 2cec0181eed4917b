// Fuzzes the router <-> worker wire decoder (common/wire/protocol.hpp): every message either side
// decodes from a ZeroMQ frame. The first byte picks the type frame (one of the ten names, or,
// for values past them, the next bytes up to a NUL as a raw type frame); the rest is the body.
// decode() must never throw, crash or read past the body; a message it accepts must encode back
// to a body that decodes to the same message. A welcome then goes where the router takes it
// (router/dispatch/dispatcher.cpp on_welcome): its tokenizer and chat template are built, and may be
// refused only by an exception.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "common/tokenizer/chat_template.hpp"
#include "common/tokenizer/tokenizer.hpp"
#include "common/wire/protocol.hpp"

namespace proto = sy::proto;

namespace {

void check_round_trip(const proto::message& m) {
  const std::string type(proto::name(proto::type_of_message(m)));
  const std::string body = proto::encode(m);
  const proto::decode_result again = proto::decode(type, body);
  if (!again.ok()) std::abort();  // what we send, we accept
  // Compared as bytes, not with ==: a float field may hold a NaN, which equals nothing.
  if (proto::encode(again.value()) != body) std::abort();
}

void build_as_router(const proto::welcome& w) {
  try {
    const sy::tokenizer tok = sy::tokenizer::from_spec(w.tokenizer);
    (void)tok.encode("Hello, world! <|im_start|>");
    (void)sy::chat_template::parse(w.tokenizer.chat_template);
  } catch (const std::exception&) {  // an unusable tokenizer: the router logs it and ignores the worker
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string type;
  if (data[0] < proto::k_n_msg_types) {
    type = proto::name(static_cast<proto::msg_type>(data[0]));
  } else {
    const size_t nul = rest.find('\0');
    type = rest.substr(0, nul);
    rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  }
  const proto::decode_result r = proto::decode(type, rest);
  if (!r.ok()) {
    if (proto::name(r.failure().code).empty()) std::abort();
    (void)proto::to_wire(r.failure());
    return 0;
  }
  check_round_trip(r.value());
  if (const auto* w = r.get_if<proto::welcome>()) build_as_router(*w);
  return 0;
}
