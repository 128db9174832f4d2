# The embedding host (tests/c/host_embed.c) once more, built from the library's
# sources under AddressSanitizer and UBSan: running out of heap, callbacks past
# their budget, interrupts and sandbox denials must each leave the VM able to
# close with nothing leaked. (tests/sh/test_install.sh builds the same host
# against the installed library.)
find_package(Threads REQUIRED)
file(GLOB CK_ASAN_SOURCES CONFIGURE_DEPENDS vm/*/*.c ops/*.c ops/cpu/*.c)
list(REMOVE_ITEM CK_ASAN_SOURCES ${CMAKE_SOURCE_DIR}/vm/cli/main.c)
add_executable(host_embed_asan tests/c/host_embed.c ${CK_ASAN_SOURCES})
target_include_directories(host_embed_asan PRIVATE ${LUA_INCLUDE_DIRS} ${CBLAS_INCLUDE} ${JANSSON_INCLUDE})
# <ck.h> as a host includes it; -idirafter so vm/ never shadows a system header.
target_compile_options(host_embed_asan PRIVATE "SHELL:-iquote ${CMAKE_SOURCE_DIR}/vm" "SHELL:-idirafter ${CMAKE_SOURCE_DIR}/vm"
  -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all)
target_compile_definitions(host_embed_asan PRIVATE CK_STDLIB_DIR="${CMAKE_SOURCE_DIR}/stdlib")
target_link_options(host_embed_asan PRIVATE -fsanitize=address,undefined)
target_link_libraries(host_embed_asan PRIVATE ${LUA_LINK_LIBRARIES} ${OPENBLAS_LIB} ${JANSSON_LIB} OpenMP::OpenMP_C Threads::Threads m)
add_test(NAME host_embed_asan COMMAND host_embed_asan WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(host_embed_asan PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2;ASAN_OPTIONS=detect_leaks=1")
