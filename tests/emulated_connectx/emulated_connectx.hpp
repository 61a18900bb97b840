// The emulated ConnectX (emulated_connectx.cpp) exports libibverbs' and libmlx5's C entry
// points; this header only names what it shows.
#pragma once

namespace rdmachan::emulated {
const char* device_name() noexcept;  // "mlx5_0"
}  // namespace rdmachan::emulated
