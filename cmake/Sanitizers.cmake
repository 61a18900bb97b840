if(RDMACHAN_SANITIZE_ADDRESS AND RDMACHAN_SANITIZE_THREAD)
    message(FATAL_ERROR "RDMACHAN_SANITIZE_ADDRESS and RDMACHAN_SANITIZE_THREAD cannot be combined")
endif()
if(RDMACHAN_SANITIZE_ADDRESS)
    add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    add_link_options(-fsanitize=address,undefined)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
        # Clang 14 cannot emit -fsanitize=function's prefix data for coroutine frames ("Cannot
        # represent a difference across sections" on the Asio coroutines in handshake/). That
        # check only looks for calls through a function pointer of the wrong type.
        add_compile_options(-fno-sanitize=function)
    endif()
endif()
if(RDMACHAN_SANITIZE_THREAD)
    # GCC 12 warns (-Wtsan) that ThreadSanitizer does not model atomic_thread_fence, which
    # Boost.Asio's fenced blocks use; Asio's handoffs also go through mutexes TSan does see, so
    # the warning stays a warning instead of failing the -Werror build.
    add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
        add_compile_options(-Wno-error=tsan)
    endif()
    add_link_options(-fsanitize=thread)
endif()
