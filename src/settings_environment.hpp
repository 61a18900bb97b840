// Channel settings a deployment may set through the environment, for builders made without
// settings of their own (ChannelBuilder(), MultiChannelBuilder()): a value the builder is then
// given still wins.
//   RDMACHAN_CQE_COMPRESSION = off | hash | checksum | checksum_stride_index (unset or empty: off)
//   RDMACHAN_SCATTER_TO_CQE = 0 | 1 (unset or empty: 0; DC mode refuses 1, as it refuses the setting)
#pragma once

#include "rdmachan/channel.hpp"

namespace rdmachan::detail {

// The settings' defaults with the environment applied; throws Error naming the variable and its
// value for a value that names nothing.
ChannelSettings settings_from_environment();

}  // namespace rdmachan::detail
