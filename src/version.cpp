#include "rdmachan/version.hpp"

namespace rdmachan {

const char* version() noexcept { return RDMACHAN_VERSION_STRING; }

}  // namespace rdmachan
