# Writes README.md's C++ block marked "<!-- compiled: tests/asio/readme_test.cpp -->" for
# readme_test.cpp, which compiles and runs it: its #include lines to readme_includes.inc and the
# rest, with a #line pointing at README.md, to readme_program.inc.
#   cmake -DREADME=<README.md> -DOUTPUT_DIR=<dir> -P readme_block.cmake
file(READ "${README}" text)
string(FIND "${text}" "<!-- compiled: tests/asio/readme_test.cpp -->" marker)
if(marker EQUAL -1)
    message(FATAL_ERROR "${README}: no code block is marked for tests/asio/readme_test.cpp")
endif()
string(SUBSTRING "${text}" ${marker} -1 rest)
string(FIND "${rest}" "```cpp\n" open)
if(open EQUAL -1)
    message(FATAL_ERROR "${README}: no ```cpp block after the readme_test.cpp marker")
endif()
math(EXPR start "${marker} + ${open} + 7")
string(SUBSTRING "${text}" ${start} -1 rest)
string(FIND "${rest}" "```" close)
string(SUBSTRING "${rest}" 0 ${close} block)

# README.md's line of the block's first line, for the compiler's messages.
string(SUBSTRING "${text}" 0 ${start} before)
string(REGEX MATCHALL "\n" newlines "${before}")
list(LENGTH newlines line)
math(EXPR line "${line} + 1")

string(REGEX MATCHALL "#include[^\n]*\n" includes "${block}")
list(LENGTH includes include_count)
string(JOIN "" includes ${includes})
string(REGEX REPLACE "#include[^\n]*\n" "" program "${block}")
math(EXPR line "${line} + ${include_count}")
file(WRITE "${OUTPUT_DIR}/readme_includes.inc" "${includes}")
file(WRITE "${OUTPUT_DIR}/readme_program.inc" "#line ${line} \"${README}\"\n${program}")
