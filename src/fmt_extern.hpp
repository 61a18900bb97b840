// Keeps the body of fmt's formatting loop out of every file that logs or formats into a buffer.
// Internal: included by src/logger.hpp after spdlog's headers.
//
// spdlog formats into a memory buffer through fmt::detail::vformat_to<char>, a template. The
// shared libfmt already holds it (fmt's format.cc instantiates it, and Debian's libfmt.so.9
// exports it), but fmt 9 does not tell the compiler so, and every file that logged compiled it
// again with all of its integer and floating-point writers: two thirds of the machine code of
// transport/soft/device_core.cpp at -O3 (122 KB of text; 38 KB with this declaration) and two
// thirds of its compile time (6.6 s; 2.2 s). Declaring the instantiation extern makes those
// files call the library's copy instead. Later fmt versions declare it themselves; a header-only
// fmt (FMT_HEADER_ONLY, or spdlog's bundled copy) has no such copy to call.
#pragma once

#include <spdlog/fmt/fmt.h>  // fmt as spdlog uses it: the external libfmt or its bundled copy

#if defined(SPDLOG_FMT_EXTERNAL) && !defined(SPDLOG_USE_STD_FORMAT) && !defined(FMT_HEADER_ONLY) && FMT_VERSION >= 90000 && FMT_VERSION < 100000
namespace fmt {
FMT_BEGIN_DETAIL_NAMESPACE
extern template FMT_API void vformat_to<char>(buffer<char>&, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>,
                                              locale_ref);
FMT_END_DETAIL_NAMESPACE
}  // namespace fmt
#endif
