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
    # Built only for the targets that reuse it (EXCLUDE_FROM_ALL; REUSE_FROM depends on it): a
    # build with no program of this kind (ThreadSanitizer's, without the tools) skips it.
    add_library(rdmachan_program_headers OBJECT EXCLUDE_FROM_ALL ${PROJECT_SOURCE_DIR}/cmake/precompiled_anchor.cpp)
    target_link_libraries(rdmachan_program_headers PRIVATE Threads::Threads nlohmann_json::nlohmann_json)
    target_precompile_headers(rdmachan_program_headers PRIVATE ${RDMACHAN_COMMON_HEADERS})
endif()

# rdmachan_precompile_program(target): a test, tool or example reuses the shared header.
# A sanitizer build runs a program only as a test (a benchmark's smoke run; it builds no tools or
# examples), so where test code has its own header (optimised builds) it compiles every program as
# test code, with that header: the programs' header is then not built there (ThreadSanitizer's
# took 54 s of its build). Decided here, before REUSE_FROM is given, since giving it also makes
# the target depend on the header's anchor for good.
function(rdmachan_precompile_program target)
    if(NOT RDMACHAN_PRECOMPILED_HEADERS)
        return()
    endif()
    if((RDMACHAN_SANITIZE_ADDRESS OR RDMACHAN_SANITIZE_THREAD) AND TARGET rdmachan_test_headers)
        target_compile_options(${target} PRIVATE ${RDMACHAN_TEST_OPTIMIZATION_OPTION})
        target_precompile_headers(${target} REUSE_FROM rdmachan_test_headers)
    else()
        target_precompile_headers(${target} REUSE_FROM rdmachan_program_headers)
    endif()
endfunction()

# The test suites' own code is compiled at -O0 in optimised builds. At -O3 most of a suite's
# compile time is spent optimising doctest's assertions and the test bodies (measured on
# soft_dc_test: 7.9 s at -O3, 4.2 s at -O1, three quarters of it in GCC's optimisers), which
# measure nothing; -O0 took another quarter off -O1 (channel_test: 11.8 s at -O1, 9.0 s at -O0,
# GCC 12). The library, the tools, the examples and every benchmark keep the build type's level,
# so the code under test is the code users run. Empty: the build type's level everywhere.
set(RDMACHAN_TEST_OPTIMIZATION "-O0" CACHE STRING
    "Optimisation flag for the test suites' own code in optimised builds (empty: the build type's)")
# Written once: test code, its precompiled header and a sanitizer build's programs must agree on
# it, or the header does not fit them (below).
set(RDMACHAN_TEST_OPTIMIZATION_OPTION $<$<NOT:$<CONFIG:Debug>>:${RDMACHAN_TEST_OPTIMIZATION}>)

# Test code has its own precompiled header in optimised builds: GCC uses a header only where
# __OPTIMIZE__ is defined the same way as where it was built, and -O0 does not define it. In a
# Debug build test code is compiled as everything else, so the programs' header serves it. The
# condition says so for single-configuration generators; with a multi-configuration one
# (CMAKE_BUILD_TYPE empty) the header is made, and RDMACHAN_TEST_OPTIMIZATION_OPTION leaves its
# Debug configuration unoptimised like the suites'.
if(RDMACHAN_PRECOMPILED_HEADERS AND RDMACHAN_TEST_OPTIMIZATION AND NOT CMAKE_BUILD_TYPE STREQUAL "Debug")
    add_library(rdmachan_test_headers OBJECT EXCLUDE_FROM_ALL ${PROJECT_SOURCE_DIR}/cmake/precompiled_anchor.cpp)
    target_link_libraries(rdmachan_test_headers PRIVATE Threads::Threads nlohmann_json::nlohmann_json)
    target_precompile_headers(rdmachan_test_headers PRIVATE ${RDMACHAN_COMMON_HEADERS})
    target_compile_options(rdmachan_test_headers PRIVATE ${RDMACHAN_TEST_OPTIMIZATION_OPTION})
endif()

# rdmachan_test_code_optimization(target): TARGET is test code (a suite, its main, a test double).
# One that reuses the programs' precompiled header reuses test code's instead; -Winvalid-pch
# would say if a header did not fit.
function(rdmachan_test_code_optimization target)
    if(RDMACHAN_TEST_OPTIMIZATION)
        target_compile_options(${target} PRIVATE ${RDMACHAN_TEST_OPTIMIZATION_OPTION})
        get_target_property(reused ${target} PRECOMPILE_HEADERS_REUSE_FROM)
        if(reused AND TARGET rdmachan_test_headers)
            set_target_properties(${target} PROPERTIES PRECOMPILE_HEADERS_REUSE_FROM rdmachan_test_headers)
        endif()
    endif()
endfunction()

# Unity builds (CMAKE_UNITY_BUILD=ON, which scripts/test.sh sets for its three builds: the
# library's ASan build took half the CPU time in batches of eight). Users' builds compile each
# file alone. These files define file-local names another library file also defines, and are
# compiled alone.
set_source_files_properties(
    ${PROJECT_SOURCE_DIR}/handshake/rendezvous_table_scanner.cpp
    ${PROJECT_SOURCE_DIR}/transport/verbs/mlx5_memory_key.cpp
    PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
