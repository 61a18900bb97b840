#pragma once

namespace rdmachan {

// The library's version as "major.minor.patch".
const char* version() noexcept;

}  // namespace rdmachan
