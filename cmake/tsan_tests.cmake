# The threaded embedding host (tests/c/test_host_threads.c) once more, built
# from the library's sources under ThreadSanitizer (test_host_threads_tsan):
# VMs opened, run, interrupted, signalled and closed from many threads at once
# must share no unsynchronized state (the handle registry, the SIGTERM
# handler, the loggers and their writer threads, the CUDA loader, the CPU
# backend). It runs with one OpenMP thread: libgomp is not built for
# ThreadSanitizer, so the synchronization inside a parallel region is not
# seen and a race reported there would be a false one (OpenBLAS and Lua are
# not instrumented either: accesses inside them are not checked).
# Left out where the build is sanitized already (make test-asan, make fuzz)
# or where a program built with -fsanitize=thread cannot run.
if(CMAKE_C_FLAGS MATCHES "sanitize" OR CK_FUZZ)
  return()
endif()
# run, not only built: on some kernels a ThreadSanitizer binary cannot start
include(CheckCSourceRuns)
set(CMAKE_REQUIRED_FLAGS -fsanitize=thread)
set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=thread)
check_c_source_runs("int main(void) { return 0; }" CK_HAVE_TSAN)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
if(NOT CK_HAVE_TSAN)
  message(STATUS "ThreadSanitizer not available: the *_tsan tests are left out")
  return()
endif()
find_package(Threads REQUIRED)
file(GLOB CK_TSAN_SOURCES CONFIGURE_DEPENDS vm/*/*.c ops/*.c ops/cpu/*.c)
list(APPEND CK_TSAN_SOURCES ${CMAKE_BINARY_DIR}/gen/tiny_vocab.c)
list(REMOVE_ITEM CK_TSAN_SOURCES ${CMAKE_SOURCE_DIR}/vm/cli/main.c)
add_library(ck_tsan_objs OBJECT ${CK_TSAN_SOURCES})
target_include_directories(ck_tsan_objs PRIVATE ${LUA_INCLUDE_DIRS} ${CBLAS_INCLUDE} ${JANSSON_INCLUDE})
set(CK_TSAN_FLAGS "SHELL:-iquote ${CMAKE_SOURCE_DIR}/vm" "SHELL:-idirafter ${CMAKE_SOURCE_DIR}/vm"
  -O1 -g -fno-omit-frame-pointer -fsanitize=thread)
target_compile_options(ck_tsan_objs PRIVATE ${CK_TSAN_FLAGS})
target_compile_definitions(ck_tsan_objs PRIVATE CK_STDLIB_DIR="${CMAKE_SOURCE_DIR}/stdlib")
target_link_libraries(ck_tsan_objs PRIVATE OpenMP::OpenMP_C)
foreach(host test_host_threads)
  add_executable(${host}_tsan tests/c/${host}.c $<TARGET_OBJECTS:ck_tsan_objs>)
  target_compile_options(${host}_tsan PRIVATE ${CK_TSAN_FLAGS})
  target_link_options(${host}_tsan PRIVATE -fsanitize=thread)
  target_link_libraries(${host}_tsan PRIVATE ${LUA_LINK_LIBRARIES} ${OPENBLAS_LIB} ${JANSSON_LIB} ${ICUUC_LIB} ${ZLIB_LIB} OpenMP::OpenMP_C Threads::Threads m)
  add_test(NAME ${host}_tsan COMMAND ${host}_tsan WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(${host}_tsan PROPERTIES ENVIRONMENT
    "OMP_NUM_THREADS=1;TSAN_OPTIONS=halt_on_error=1:exitcode=66:second_deadlock_stack=1")
endforeach()
