# README.md shows examples/first_program.cpp whole, in the C++ block after the marker
# "<!-- the whole of examples/first_program.cpp -->": fails, naming both files, when they differ.
#   cmake -DREADME=<README.md> -DPROGRAM=<first_program.cpp> -P readme_first_program.cmake
include(${CMAKE_CURRENT_LIST_DIR}/../cmake/ReadmeBlock.cmake)
readme_block("${README}" "<!-- the whole of examples/first_program.cpp -->" block line)
file(READ "${PROGRAM}" program)
if(NOT block STREQUAL program)
    message(FATAL_ERROR "${README}'s first program (from line ${line}) differs from ${PROGRAM}: copy the file into the block")
endif()
message(STATUS "README.md's first program is examples/first_program.cpp, whole")
