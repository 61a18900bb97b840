// Marks a function whose instructions callgrind counts (--toggle-collect='*measured_*'): a real
// call, never inlined or cloned into the loop that calls it (GCC's noclone; Clang does not clone
// functions this way and has no such attribute).
#pragma once

#if defined(__clang__)
#define MEASURED_FUNCTION __attribute__((noinline))
#else
#define MEASURED_FUNCTION __attribute__((noinline, noclone))
#endif
