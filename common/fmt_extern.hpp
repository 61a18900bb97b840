// Keeps the body of fmt's formatting loop out of every file that logs or formats into a buffer.
// Internal: included by common/logger.hpp after spdlog's headers.
//
// spdlog formats into a memory buffer through fmt::detail::vformat_to<char>, a template. The
// shared libfmt already holds it (fmt's format.cc instantiates it, and Debian's libfmt.so.9
// exports it), but fmt 9 does not tell the compiler so, and every file that logged compiled it
// again with all of its integer and floating-point writers: two thirds of the machine code of
// transport/soft/device_core.cpp at -O3 (122 KB of text; 38 KB with this declaration) and two
// thirds of its compile time (6.6 s; 2.2 s). Declaring the instantiation extern makes those
// files call the library's copy instead. Declared only when CMake found that a program doing so
// links against the installed fmt (RDMACHAN_FMT_EXTERN_VFORMAT_TO, CMakeLists.txt): fmt 10 and
// later declare it themselves with another signature; a header-only fmt has no copy to call; and
// Clang mangles this signature differently from GCC, which built Debian's libfmt (a dependent
// std::is_same in it: "sr3std7is_same" against "srSt7is_same"), so under Clang the symbol is not
// found and the declaration is left out.
#pragma once

#include <spdlog/fmt/fmt.h>  // fmt as spdlog uses it: the external libfmt or its bundled copy

#if defined(RDMACHAN_FMT_EXTERN_VFORMAT_TO) && defined(SPDLOG_FMT_EXTERNAL) && !defined(SPDLOG_USE_STD_FORMAT) && \
    !defined(FMT_HEADER_ONLY)
namespace fmt {
FMT_BEGIN_DETAIL_NAMESPACE
extern template FMT_API void vformat_to<char>(buffer<char>&, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>,
                                              locale_ref);
FMT_END_DETAIL_NAMESPACE
}  // namespace fmt
#endif
