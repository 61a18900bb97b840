#include "transport/verbs/mlx5_memory_key.hpp"

#include <cerrno>
#include <string>

#include "common/logger.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

std::unique_ptr<Mlx5IndirectKey> Mlx5IndirectKey::create(std::shared_ptr<ProtectionDomain> pd,
                                                         std::uint32_t max_entries) {
    if (pd == nullptr) throw VerbsError("mlx5dv_create_mkey: no protection domain", EINVAL);
    if (max_entries == 0 || max_entries > 0xffff) {
        throw VerbsError("mlx5dv_create_mkey: max_entries = " + std::to_string(max_entries) +
                             " (1 to 65535)",
                         EINVAL);
    }
    mlx5dv_mkey_init_attr attributes{};
    attributes.pd = pd->handle();
    attributes.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
    attributes.max_entries = static_cast<std::uint16_t>(max_entries);
    mlx5dv_mkey* key = mlx5dv_create_mkey(&attributes);
    if (key == nullptr) {
        throw_from_errno("mlx5dv_create_mkey",
                         "an indirect memory key of " + std::to_string(max_entries) + " entries");
    }
    return std::unique_ptr<Mlx5IndirectKey>(
        new Mlx5IndirectKey(std::move(pd), key, attributes.max_entries));
}

Mlx5IndirectKey::~Mlx5IndirectKey() {
    const int result = mlx5dv_destroy_mkey(key_);
    // A destructor cannot throw: the key stays with the device until its context closes.
    if (result != 0) {
        detail::logger().warn("mlx5dv_destroy_mkey(lkey 0x{:x}) failed: {}", key_->lkey,
                              describe_error_code(result));
    }
}

void throw_layouts_unavailable(std::string_view device_name) {
    throw VerbsError("memory layouts are not available on device " + std::string(device_name) +
                         ": they need mlx5 UMR (mlx5dv_create_mkey), which the generic verbs "
                         "path does not have",
                     EOPNOTSUPP);
}

}  // namespace rdmachan::verbs
