// The built-in reference backend: the SDK's reference executor (loom/sdk/reference.hpp), the very
// code the reference_plugin backend plugin runs.
#include "loom/model/reference_backend.hpp"

#include "loom/sdk/reference.hpp"

namespace loom {

std::unique_ptr<Backend> make_reference_backend() {
  return std::make_unique<ReferenceBackend>();
}

} // namespace loom
