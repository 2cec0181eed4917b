#include "common/wire/curve_keys.hpp"

#include <sys/stat.h>
#include <zmq.h>

#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace sy::curve {
namespace {

constexpr size_t k_z85_chars = 40;  // 32 bytes in Z85

bool well_formed(const std::string& z85) {
  uint8_t bin[32];
  return z85.size() == k_z85_chars && zmq_z85_decode(bin, z85.c_str()) != nullptr;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

bool available() { return zmq_has("curve") != 0; }

key_pair generate() {
  char pub[k_z85_chars + 1], sec[k_z85_chars + 1];
  if (!available() || zmq_curve_keypair(pub, sec) != 0)
    throw std::runtime_error("this libzmq has no CURVE support (built without libsodium)");
  return {pub, sec};
}

key_pair from_secret(const std::string& secret_z85) {
  if (!well_formed(secret_z85)) throw std::invalid_argument("not a 40-character Z85 CURVE key");
  char pub[k_z85_chars + 1];
  if (zmq_curve_public(pub, secret_z85.c_str()) != 0)
    throw std::invalid_argument("cannot derive the public key (no CURVE support in this libzmq?)");
  return {pub, secret_z85};
}

std::string read_key_file(const std::string& path, const std::string& what) {
  std::ifstream f(path);
  if (!f) throw std::invalid_argument(what + ": cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string key = trim(ss.str());
  if (!well_formed(key)) throw std::invalid_argument(what + ": " + path + " does not hold one 40-character Z85 key");
  return key;
}

std::set<std::string> read_key_list(const std::string& path, const std::string& what) {
  std::ifstream f(path);
  if (!f) throw std::invalid_argument(what + ": cannot read " + path);
  std::set<std::string> keys;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (!well_formed(line))
      throw std::invalid_argument(what + ": " + path + " line " + std::to_string(n) + " is not a Z85 public key");
    keys.insert(line);
  }
  return keys;
}

void write_key_files(const key_pair& k, const std::string& prefix) {
  const auto put = [](const std::string& path, const std::string& text, mode_t mode) {
    std::ofstream f(path, std::ios::trunc);
    if (!f) throw std::runtime_error("cannot write " + path);
    ::chmod(path.c_str(), mode);  // before the key goes in: a secret is never world-readable
    f << text << "\n";
    if (!f.flush()) throw std::runtime_error("cannot write " + path);
  };
  put(prefix + ".key", k.secret_z85, 0600);
  put(prefix + ".pub", k.public_z85, 0644);
}

namespace {
void set_option(void* socket, int option, const void* value, size_t size, const char* name) {
  if (zmq_setsockopt(socket, option, value, size) != 0)
    throw std::runtime_error(std::string("CURVE: cannot set ") + name + ": " + zmq_strerror(zmq_errno()));
}
// Z85 keys go in with their terminating NUL (41 bytes), the form every libzmq 4.x accepts.
void set_key(void* socket, int option, const std::string& z85, const char* name) {
  set_option(socket, option, z85.c_str(), z85.size() + 1, name);
}
}  // namespace

void make_server(void* socket, const std::string& secret_z85) {
  const int on = 1;
  set_option(socket, ZMQ_CURVE_SERVER, &on, sizeof on, "ZMQ_CURVE_SERVER");
  set_key(socket, ZMQ_CURVE_SECRETKEY, secret_z85, "ZMQ_CURVE_SECRETKEY");
}

void make_client(void* socket, const key_pair& own, const std::string& server_public_z85) {
  set_key(socket, ZMQ_CURVE_SERVERKEY, server_public_z85, "ZMQ_CURVE_SERVERKEY");
  set_key(socket, ZMQ_CURVE_PUBLICKEY, own.public_z85, "ZMQ_CURVE_PUBLICKEY");
  set_key(socket, ZMQ_CURVE_SECRETKEY, own.secret_z85, "ZMQ_CURVE_SECRETKEY");
}

std::string z85_of(const void* key, size_t size) {
  if (size != 32) return "";
  char out[k_z85_chars + 1];
  return zmq_z85_encode(out, static_cast<const uint8_t*>(key), size) ? std::string(out) : "";
}

}  // namespace sy::curve
