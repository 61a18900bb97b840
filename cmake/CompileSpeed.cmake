# What keeps compiling this project quick: a compiler cache when one is installed, and the
# heavy third-party headers parsed once per build instead of once per file.
#
# nlohmann/json reaches almost every file through the public headers, and spdlog every library
# file that logs; each costs one to two seconds to parse, more than many of our files take to
# compile. Precompiled, they are parsed once for the library and once for all programs.

option(RDMACHAN_COMPILER_CACHE "Compile through ccache when it is installed" ON)
option(RDMACHAN_PRECOMPILED_HEADERS "Precompile the heavy third-party headers" ON)

# Must run before any target exists: targets copy the launcher when they are created.
if(RDMACHAN_COMPILER_CACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
    find_program(RDMACHAN_CCACHE_PROGRAM ccache)
    if(RDMACHAN_CCACHE_PROGRAM)
        set(CMAKE_CXX_COMPILER_LAUNCHER ${RDMACHAN_CCACHE_PROGRAM})
        message(STATUS "rdmachan: compiling through ${RDMACHAN_CCACHE_PROGRAM}")
    endif()
endif()

set(RDMACHAN_COMMON_HEADERS
    <algorithm> <atomic> <chrono> <cstdint> <cstring> <functional> <map> <memory> <mutex>
    <optional> <span> <stdexcept> <string> <string_view> <thread> <unordered_map> <utility>
    <vector> <nlohmann/json.hpp>)

# rdmachan_precompile_library(target): the library's own precompiled header.
function(rdmachan_precompile_library target)
    if(RDMACHAN_PRECOMPILED_HEADERS)
        target_precompile_headers(${target} PRIVATE ${RDMACHAN_COMMON_HEADERS} <spdlog/spdlog.h>)
    endif()
endfunction()

# One precompiled header shared by every test, tool and example: they are compiled with the same
# flags, so the header built for this anchor target is valid for all of them (CMake's
# REUSE_FROM). A program built with other flags would simply parse the headers itself.
if(RDMACHAN_PRECOMPILED_HEADERS)
    add_library(rdmachan_program_headers OBJECT ${PROJECT_SOURCE_DIR}/cmake/precompiled_anchor.cpp)
    target_link_libraries(rdmachan_program_headers PRIVATE Threads::Threads nlohmann_json::nlohmann_json)
    target_precompile_headers(rdmachan_program_headers PRIVATE ${RDMACHAN_COMMON_HEADERS})
endif()

# rdmachan_precompile_program(target): a test, tool or example reuses the shared header.
function(rdmachan_precompile_program target)
    if(RDMACHAN_PRECOMPILED_HEADERS)
        target_precompile_headers(${target} REUSE_FROM rdmachan_program_headers)
    endif()
endfunction()
