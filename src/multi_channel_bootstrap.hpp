// MultiChannelBuilder::build()'s view of the bootstrap (include/rdmachan/bootstrap.hpp): which
// one, and under PMIx the rank and world size the launcher gives, checked against the builder's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "rdmachan/bootstrap.hpp"

namespace rdmachan::detail {

class PmixSession;

struct BootstrapIdentity {
    BootstrapChoice choice;
    std::optional<std::uint32_t> rank;
    std::optional<std::uint32_t> world_size;
    std::shared_ptr<PmixSession> pmix;  // open under the PMIx bootstrap
};

// Chooses the bootstrap; under PMIx opens the session (within `deadline` from now) and takes
// rank and world size from it. Throws rdmachan::Error when a set rank or world size disagrees
// with PMIx (naming both), or the launcher did not answer in time.
BootstrapIdentity bootstrap_identity(Bootstrap requested, std::optional<std::uint32_t> rank,
                                     std::optional<std::uint32_t> world_size, std::chrono::milliseconds deadline);

}  // namespace rdmachan::detail
