// Deliberately empty: the target that owns the precompiled header every program reuses
// (cmake/CompileSpeed.cmake) needs one source file to compile it for.
