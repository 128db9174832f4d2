# The embedding hosts (tests/c/host_embed.c, tests/c/test_host_handles.c) once
# more, built from the library's sources under AddressSanitizer and UBSan:
# running out of heap, callbacks past their budget, interrupts, sandbox
# denials, closed handles and SIGTERM after a close must each leave the VM able
# to close with nothing leaked and no freed memory touched.
# (tests/sh/test_install.sh builds host_embed against the installed library.)
# Left out where the whole build is sanitized already (make test-asan, make
# fuzz): make test ran these same hosts under the same sanitizers, and a
# second copy of the library's objects would only double the build.
if(CMAKE_C_FLAGS MATCHES "sanitize" OR CK_FUZZ)
  return()
endif()
find_package(Threads REQUIRED)
file(GLOB CK_ASAN_SOURCES CONFIGURE_DEPENDS vm/*/*.c ops/*.c ops/cpu/*.c)
list(REMOVE_ITEM CK_ASAN_SOURCES ${CMAKE_SOURCE_DIR}/vm/cli/main.c)
list(APPEND CK_ASAN_SOURCES ${CMAKE_BINARY_DIR}/gen/tiny_vocab.c)
add_library(ck_asan_objs OBJECT ${CK_ASAN_SOURCES})
target_include_directories(ck_asan_objs PRIVATE ${LUA_INCLUDE_DIRS} ${CBLAS_INCLUDE} ${JANSSON_INCLUDE})
# <ck.h> as a host includes it; -idirafter so vm/ never shadows a system header.
set(CK_ASAN_FLAGS "SHELL:-iquote ${CMAKE_SOURCE_DIR}/vm" "SHELL:-idirafter ${CMAKE_SOURCE_DIR}/vm"
  -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all)
target_compile_options(ck_asan_objs PRIVATE ${CK_ASAN_FLAGS})
target_compile_definitions(ck_asan_objs PRIVATE CK_STDLIB_DIR="${CMAKE_SOURCE_DIR}/stdlib")
target_link_libraries(ck_asan_objs PRIVATE OpenMP::OpenMP_C)
foreach(host host_embed test_host_handles)
  add_executable(${host}_asan tests/c/${host}.c $<TARGET_OBJECTS:ck_asan_objs>)
  target_compile_options(${host}_asan PRIVATE ${CK_ASAN_FLAGS})
  target_link_options(${host}_asan PRIVATE -fsanitize=address,undefined)
  target_link_libraries(${host}_asan PRIVATE ${LUA_LINK_LIBRARIES} ${OPENBLAS_LIB} ${JANSSON_LIB} ${ICUUC_LIB} ${ZLIB_LIB} OpenMP::OpenMP_C Threads::Threads m)
  add_test(NAME ${host}_asan COMMAND ${host}_asan WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(${host}_asan PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2;ASAN_OPTIONS=detect_leaks=1")
endforeach()
