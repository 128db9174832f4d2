# The CUDA backend (ops/cuda) and its tests. Everything here is optional: a
# machine without the CUDA toolkit builds the CPU runtime as before.
#
# - ck_cuda: ops/cuda/*.cu for sm_90 (SASS) plus compute_90 PTX, with cuBLAS
#   and cuDNN; defines CK_HAVE_CUDA for whoever links it. Built when nvcc,
#   cuBLAS and cuDNN are found (under /usr/local/cuda unless told otherwise).
#   With NCCL found too (and CK_NCCL on) it defines CK_HAVE_NCCL and links it:
#   data parallel on GPUs (ops/cuda/comm.cu); without, data parallel on CUDA
#   is refused.
# - test_cuda_table: every op with a CPU kernel has a CUDA kernel (no device needed).
# - test_cuda_ops: every op on both backends, compared; skipped (exit 77) without a device.
# - bench_cuda_ops (not built by default): per-op timings, see bench/gpu_check.sh.
# - test_cuda_graph (skipped without a device), test_cuda_graph_emu: stream
#   capture and graph replay of single ops against eager launches.
# - test_cuda_ops_emu: the same comparison with ops/cuda built as C++ against
#   tests/cuda_emu, which runs the kernels on the CPU. Needs only a C++ compiler.
# - libck_cuda.so: the backend libck loads on first use (vm/run/cuda_loader.c);
#   libck_cuda_emu.so the same on the emulator, whose NCCL (tests/cuda_emu/
#   nccl_emu.cpp) runs over MPI when ckrun is built with MPI.
# - lua_test_device: tests/device/test_device.lua on a CUDA device (skipped
#   without one); lua_test_device_emu: the same on the emulator (smaller model).
# - lua_test_graph, lua_test_graph_emu: tests/device/test_graph.lua (graph
#   replay against op by op) on a device, and on the emulator.
include(CheckLanguage)

option(CK_CUDA "build the CUDA backend when the toolkit is found" ON)
option(CK_CUDA_EMU "test the CUDA kernels under the CPU emulator (tests/cuda_emu)" ON)
option(CK_NCCL "data parallel on GPUs through NCCL when it is found" ON)

file(GLOB CK_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/ops/cuda/*.cu)
set(CK_CUDA_FOUND FALSE)

if(CK_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # set before enable_language, so CMake does not probe for a default
    # architecture (CUDA 13 no longer builds the old defaults)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/local/cuda/lib)
    if(CUDAToolkit_FOUND AND TARGET CUDA::cublas AND CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
      set(CK_CUDA_FOUND TRUE)
    else()
      message(STATUS "CUDA backend: off (cuBLAS or cuDNN not found)")
    endif()
  else()
    message(STATUS "CUDA backend: off (no nvcc)")
  endif()
else()
  message(STATUS "CUDA backend: off (CK_CUDA=OFF)")
endif()

if(CK_CUDA_FOUND)
  message(STATUS "CUDA backend: on (CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, ${CUDNN_LIBRARY})")
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  add_library(ck_cuda OBJECT ${CK_CUDA_SOURCES} ${CMAKE_SOURCE_DIR}/ops/cuda/table.c
    ${CMAKE_SOURCE_DIR}/ops/cuda/backend.c)
  target_include_directories(ck_cuda PUBLIC ${CMAKE_SOURCE_DIR}/ops ${CUDNN_INCLUDE_DIR})
  target_compile_definitions(ck_cuda PUBLIC CK_HAVE_CUDA)
  target_compile_options(ck_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-O3 -lineinfo -Xcompiler=-Wall>)
  # the shared CUDA libraries are the toolkit's, on the loader's path
  set(CK_CUDA_LIBS CUDA::cudart CUDA::cublas CUDA::cublasLt ${CUDNN_LIBRARY})
  if(CK_NCCL)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/local/cuda/lib)
  endif()
  if(CK_NCCL AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    message(STATUS "CUDA backend: NCCL ${NCCL_LIBRARY}")
    target_include_directories(ck_cuda PUBLIC ${NCCL_INCLUDE_DIR})
    target_compile_definitions(ck_cuda PUBLIC CK_HAVE_NCCL)
    list(APPEND CK_CUDA_LIBS ${NCCL_LIBRARY})
  else()
    message(STATUS "CUDA backend: no NCCL (data parallel on CUDA is refused)")
  endif()
  # targets made before CUDA was enabled may link CUDA objects (the tests)
  get_property(made DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t ${made})
    set_target_properties(${t} PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
  endforeach()

  # libck_cuda.so, which libck loads on first use (vm/run/cuda_loader.c); the op
  # rules come along so that it needs nothing from its host
  add_library(ck_cuda_module SHARED $<TARGET_OBJECTS:ck_cuda> ${CMAKE_SOURCE_DIR}/ops/rules.c)
  set_target_properties(ck_cuda_module PROPERTIES OUTPUT_NAME ck_cuda LINKER_LANGUAGE CUDA)
  target_link_libraries(ck_cuda_module PRIVATE ${CK_CUDA_LIBS})
  target_link_options(ck_cuda_module PRIVATE -Wl,--no-undefined)

  # per-op timings against PyTorch (bench/gpu_check.sh)
  add_executable(bench_cuda_ops EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/bench/cuda_ops.c)
  target_link_libraries(bench_cuda_ops PRIVATE ck_cuda ck_static ${CK_CUDA_LIBS})
  set_target_properties(bench_cuda_ops PROPERTIES LINKER_LANGUAGE CUDA)
endif()

# the executor on the CUDA backend: training, recompute, host I/O, logging;
# skipped (exit 77) where no CUDA device is usable
add_test(NAME lua_test_device COMMAND ckrun --trust tests/device/test_device.lua WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_test_device PROPERTIES ENVIRONMENT "CK_BUILD=${CMAKE_BINARY_DIR}" SKIP_RETURN_CODE 77)
# graph replay against op by op on the CUDA backend (tests/device/test_graph.lua)
add_test(NAME lua_test_graph COMMAND ckrun --trust tests/device/test_graph.lua WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(lua_test_graph PROPERTIES ENVIRONMENT "CK_BUILD=${CMAKE_BINARY_DIR}" SKIP_RETURN_CODE 77)

foreach(name test_cuda_ops test_cuda_table test_cuda_graph)
  if(TARGET ${name})
    if(CK_CUDA_FOUND)
      target_link_libraries(${name} PRIVATE ck_cuda ${CK_CUDA_LIBS})
      set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CUDA)
    endif()
    # without the toolkit, or without a device, these print SKIP and exit 77
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endforeach()

if(CK_CUDA_EMU)
  check_language(CXX)
  if(CMAKE_CXX_COMPILER)
    enable_language(CXX)
    # each .cu compiled as C++ through a one-line wrapper (a source file can be
    # of one language only, and ck_cuda compiles the same files as CUDA)
    set(emu_sources ${CMAKE_SOURCE_DIR}/tests/cuda_emu/cuda_emu.cpp ${CMAKE_SOURCE_DIR}/tests/cuda_emu/cublaslt_emu.cpp
      ${CMAKE_SOURCE_DIR}/tests/cuda_emu/cudnn_find_emu.cpp ${CMAKE_SOURCE_DIR}/tests/cuda_emu/graph_emu.cpp
      ${CMAKE_SOURCE_DIR}/tests/cuda_emu/stream_emu.cpp
      ${CMAKE_SOURCE_DIR}/ops/cuda/table.c)
    # the emulated NCCL runs over MPI: with it, the emulated backend has data parallel
    if(CK_NCCL AND TARGET MPI::MPI_C)
      list(APPEND emu_sources ${CMAKE_SOURCE_DIR}/tests/cuda_emu/nccl_emu.cpp)
      set(emu_nccl TRUE)
    else()
      set(emu_nccl FALSE)
    endif()
    foreach(cu ${CK_CUDA_SOURCES})
      get_filename_component(stem ${cu} NAME_WE)
      set(wrapper ${CMAKE_BINARY_DIR}/cuda_emu/${stem}.cpp)
      file(CONFIGURE OUTPUT ${wrapper} CONTENT "#include \"${cu}\"\n")
      list(APPEND emu_sources ${wrapper})
    endforeach()
    list(APPEND emu_sources ${CMAKE_SOURCE_DIR}/ops/cuda/backend.c)
    add_library(ck_cuda_emu OBJECT ${emu_sources})
    set_target_properties(ck_cuda_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
    # never ops/cuda itself: its cuda.h would shadow the toolkit's
    target_include_directories(ck_cuda_emu PUBLIC ${CMAKE_SOURCE_DIR}/ops ${CMAKE_SOURCE_DIR}/tests/cuda_emu)
    target_compile_definitions(ck_cuda_emu PUBLIC CK_CUDA_EMU)
    target_compile_options(ck_cuda_emu PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O2 -Wno-unknown-pragmas -Wno-unused-parameter>)
    if(emu_nccl)
      target_compile_definitions(ck_cuda_emu PUBLIC CK_HAVE_NCCL)
      target_link_libraries(ck_cuda_emu PUBLIC MPI::MPI_C)
    endif()

    add_executable(test_cuda_ops_emu ${CMAKE_SOURCE_DIR}/tests/c/test_cuda_ops.c)
    target_link_libraries(test_cuda_ops_emu PRIVATE ck_cuda_emu ck_static)
    set_target_properties(test_cuda_ops_emu PROPERTIES LINKER_LANGUAGE CXX)
    add_test(NAME test_cuda_ops_emu COMMAND test_cuda_ops_emu WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    add_executable(test_cuda_graph_emu ${CMAKE_SOURCE_DIR}/tests/c/test_cuda_graph.c)
    target_link_libraries(test_cuda_graph_emu PRIVATE ck_cuda_emu ck_static)
    set_target_properties(test_cuda_graph_emu PROPERTIES LINKER_LANGUAGE CXX)
    add_test(NAME test_cuda_graph_emu COMMAND test_cuda_graph_emu WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    # offload's copy stream, events and pinned memory on the emulator (tests/c/emu_offload.c)
    add_executable(test_offload_emu ${CMAKE_SOURCE_DIR}/tests/c/emu_offload.c)
    target_link_libraries(test_offload_emu PRIVATE ck_cuda_emu ck_static)
    set_target_properties(test_offload_emu PROPERTIES LINKER_LANGUAGE CXX)
    add_test(NAME test_offload_emu COMMAND test_offload_emu WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    # a program's lists captured after the first run searched its convolutions (tests/c/emu_capture.c)
    add_executable(test_capture_emu ${CMAKE_SOURCE_DIR}/tests/c/emu_capture.c)
    target_link_libraries(test_capture_emu PRIVATE ck_cuda_emu ck_static)
    set_target_properties(test_capture_emu PROPERTIES LINKER_LANGUAGE CXX)
    add_test(NAME test_capture_emu COMMAND test_capture_emu WORKING_DIRECTORY ${CMAKE_BINARY_DIR})

    # libck_cuda_emu.so: the CUDA backend on the emulator, for
    # CK_CUDA_MODULE=...: the executor, the plans and the Lua API on device
    # "cuda" without a GPU (slow; small models only)
    add_library(ck_cuda_emu_module SHARED $<TARGET_OBJECTS:ck_cuda_emu> ${CMAKE_SOURCE_DIR}/ops/rules.c)
    set_target_properties(ck_cuda_emu_module PROPERTIES OUTPUT_NAME ck_cuda_emu LINKER_LANGUAGE CXX)
    if(emu_nccl)
      target_link_libraries(ck_cuda_emu_module PRIVATE MPI::MPI_C)
    endif()
    add_test(NAME lua_test_device_emu COMMAND ckrun --trust tests/device/test_device.lua
      WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(lua_test_device_emu PROPERTIES ENVIRONMENT
      "CK_BUILD=${CMAKE_BINARY_DIR};CK_CUDA_MODULE=$<TARGET_FILE:ck_cuda_emu_module>;CK_DEVICE_TEST=small")
    add_test(NAME lua_test_graph_emu COMMAND ckrun --trust tests/device/test_graph.lua
      WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(lua_test_graph_emu PROPERTIES ENVIRONMENT
      "CK_BUILD=${CMAKE_BINARY_DIR};CK_CUDA_MODULE=$<TARGET_FILE:ck_cuda_emu_module>;CK_EMU_GRAPH_LOG=${CMAKE_BINARY_DIR}/test_graph_emu.log")
  else()
    message(STATUS "CUDA emulator tests: off (no C++ compiler)")
  endif()
endif()

# data parallel through NCCL on the emulator (tests/sh/test_mpi_nccl_emu.sh):
# skipped (77) without mpirun, MPI or the emulator's NCCL; alone, as the other MPI tests
if(TEST sh_test_mpi_nccl_emu)
  set_tests_properties(sh_test_mpi_nccl_emu PROPERTIES SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endif()
