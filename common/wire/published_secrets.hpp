// Secrets this project has published: the example tenants' API keys, and the CURVE and cache MAC
// keys its Kubernetes base used to carry (they remain in the repository's history). A deployment
// that uses one is open to anyone who has read them, so the router and the worker refuse them at
// start-up unless the operator says the run is a demo (--allow-example-keys). Known by SHA-256
// only. Deployments make their own with deploy/k8s/make-secrets.py (docs/operations.md).
#pragma once

#include <string>
#include <string_view>

namespace sy {

// What `secret` is the published example of ("an example API key", ...), or "" when it is none.
// For a CURVE key pass its Z85 text, for the MAC key the bytes the router reads.
std::string published_secret(std::string_view secret);

// Refuses a published `secret` found at `where` (a flag, a file, a tenant): throws
// std::invalid_argument saying so and what to do, unless `demo` (--allow-example-keys), when it
// prints a warning on stderr instead. Nothing happens for any other secret.
void refuse_published(std::string_view secret, const std::string& where, bool demo);

}  // namespace sy
