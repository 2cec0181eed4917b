// CURVE keys for the router <-> worker link (libzmq's CurveZMQ: Curve25519 key exchange and
// authenticated encryption). Keys are 32 bytes, kept and passed as 40-character Z85 text, the
// form libzmq's socket options take. A key file holds one key as Z85 text (surrounding
// whitespace ignored); the public key of a secret is derived, so an operator ships one file per
// key pair plus the peer's public key.
//
// Who holds what (docs/operations.md, "Securing the worker link"):
//   worker  its secret key (server side), optionally the public keys of the routers it admits;
//   router  its own secret key (or an ephemeral pair) and the workers' public key.
#pragma once

#include <set>
#include <string>

namespace sy::curve {

// Whether this libzmq was built with CURVE (Debian's libzmq5 is: libsodium).
bool available();

struct key_pair {
  std::string public_z85;  // 40 characters
  std::string secret_z85;  // 40 characters
};

// A new random pair. Throws std::runtime_error when CURVE is unavailable.
key_pair generate();
// The pair whose secret is `secret_z85`. Throws std::invalid_argument for a malformed key.
key_pair from_secret(const std::string& secret_z85);
// One key from a file: its Z85 text. Throws std::invalid_argument naming `what` and the file
// when it cannot be read or is not one well-formed Z85 key.
std::string read_key_file(const std::string& path, const std::string& what);
// Public keys, one per line (blank lines and '#' comments skipped), as Z85 text.
std::set<std::string> read_key_list(const std::string& path, const std::string& what);
// Writes PREFIX.key (the secret, mode 0600) and PREFIX.pub (the public key). Throws on failure.
void write_key_files(const key_pair& k, const std::string& prefix);
// Socket options (`socket` is a libzmq socket handle, before bind/connect). Throw
// std::runtime_error when libzmq refuses them.
void make_server(void* socket, const std::string& secret_z85);
void make_client(void* socket, const key_pair& own, const std::string& server_public_z85);
// The Z85 text of a 32-byte binary key (as ZAP hands credentials over); "" for another size.
std::string z85_of(const void* key, size_t size);

}  // namespace sy::curve
