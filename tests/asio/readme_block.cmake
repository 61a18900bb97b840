# Writes README.md's C++ block marked "<!-- compiled: tests/asio/readme_test.cpp -->" for
# readme_test.cpp, which compiles and runs it: its #include lines to readme_includes.inc and the
# rest, with a #line pointing at README.md, to readme_program.inc.
#   cmake -DREADME=<README.md> -DOUTPUT_DIR=<dir> -P readme_block.cmake
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/ReadmeBlock.cmake)
readme_block("${README}" "<!-- compiled: tests/asio/readme_test.cpp -->" block line)
string(REGEX MATCHALL "#include[^\n]*\n" includes "${block}")
list(LENGTH includes include_count)
string(JOIN "" includes ${includes})
string(REGEX REPLACE "#include[^\n]*\n" "" program "${block}")
math(EXPR line "${line} + ${include_count}")
file(WRITE "${OUTPUT_DIR}/readme_includes.inc" "${includes}")
file(WRITE "${OUTPUT_DIR}/readme_program.inc" "#line ${line} \"${README}\"\n${program}")
