// Indirect memory keys on a ConnectX: mlx5dv_create_mkey with MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
// and mlx5dv_destroy_mkey, owned by one value. The key is created free; a UMR WQE the data path
// writes (transport/mlx5/umr_segments.hpp) gives it a layout. Only mlx5 devices have them: the
// generic verbs path names the device when asked for one.
#pragma once

#include <infiniband/mlx5dv.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "transport/verbs/protection_domain.hpp"

namespace rdmachan::verbs {

class Mlx5IndirectKey {
  public:
    // max_entries: the translations the key must hold (1 or more). libmlx5 rounds it up to a
    // multiple of 4 and reports the result (verbs.c _mlx5dv_create_mkey); max_entries() says it.
    // Throws VerbsError naming the device and max_entries when the device refuses.
    static std::unique_ptr<Mlx5IndirectKey> create(std::shared_ptr<ProtectionDomain> pd,
                                                   std::uint32_t max_entries);
    ~Mlx5IndirectKey();
    Mlx5IndirectKey(const Mlx5IndirectKey&) = delete;
    Mlx5IndirectKey& operator=(const Mlx5IndirectKey&) = delete;

    std::uint32_t lkey() const noexcept { return key_->lkey; }
    std::uint32_t rkey() const noexcept { return key_->rkey; }
    std::uint32_t max_entries() const noexcept { return max_entries_; }

  private:
    Mlx5IndirectKey(std::shared_ptr<ProtectionDomain> pd, mlx5dv_mkey* key, std::uint32_t max_entries)
        : pd_(std::move(pd)), key_(key), max_entries_(max_entries) {}
    std::shared_ptr<ProtectionDomain> pd_;  // outlives the key
    mlx5dv_mkey* key_;
    std::uint32_t max_entries_;
};

// The error a device without UMR (the generic verbs path, e.g. rxe) gives for a memory layout.
[[noreturn]] void throw_layouts_unavailable(std::string_view device_name);

}  // namespace rdmachan::verbs
