# The fuzz harnesses (tests/fuzz): the safetensors reader, script loading,
# dataset samples, the checkpoint key mapping, the image readers, the
# tokenizer's file readers, the sentencepiece model reader and the TOML reader.
#
# Always: each harness with a plain main (tests/fuzz/replay_main.c) against
# the library, and a test that replays its seed corpus and past findings
# (tests/fuzz/corpus/NAME, tests/fuzz/crashes/NAME) through it, so make test
# and make test-asan keep every harness invariant without clang.
#
# With -DCK_FUZZ=ON and clang, in a build directory of their own (make fuzz
# uses build-fuzz): the libFuzzer harnesses, each linked with
# -fsanitize=fuzzer,address,undefined; the library's sources are compiled once
# more, instrumented for coverage and the sanitizers. OpenBLAS and Lua stay
# uninstrumented.
option(CK_FUZZ "build the libFuzzer harnesses (needs clang)" OFF)

foreach(h safetensors script dataset checkpoint image tokenizer spm toml)
  add_executable(fuzz_replay_${h} tests/fuzz/fuzz_${h}.c tests/fuzz/replay_main.c)
  target_compile_options(fuzz_replay_${h} PRIVATE "SHELL:-idirafter ${CMAKE_SOURCE_DIR}/vm")
  target_link_libraries(fuzz_replay_${h} PRIVATE ck_static)
  set(inputs ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${h})
  if(EXISTS ${CMAKE_SOURCE_DIR}/tests/fuzz/crashes/${h})
    list(APPEND inputs ${CMAKE_SOURCE_DIR}/tests/fuzz/crashes/${h})
  endif()
  add_test(NAME fuzz_replay_${h} COMMAND fuzz_replay_${h} ${inputs} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(fuzz_replay_${h} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
endforeach()

if(CK_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CK_FUZZ needs clang (libFuzzer): configure with CC=clang in a separate build directory")
  endif()
  set(CK_FUZZ_FLAGS -O1 -g -fno-omit-frame-pointer -Wno-pass-failed -fsanitize=address,undefined -fno-sanitize-recover=all)

  file(GLOB CK_FUZZ_LIB_SOURCES CONFIGURE_DEPENDS vm/*/*.c ops/*.c ops/cpu/*.c)
  list(APPEND CK_FUZZ_LIB_SOURCES ${CMAKE_BINARY_DIR}/gen/tiny_vocab.c)
  list(REMOVE_ITEM CK_FUZZ_LIB_SOURCES ${CMAKE_SOURCE_DIR}/vm/cli/main.c)
  add_library(ck_fuzz_objs OBJECT EXCLUDE_FROM_ALL ${CK_FUZZ_LIB_SOURCES})
  target_include_directories(ck_fuzz_objs PUBLIC ${LUA_INCLUDE_DIRS} ${CBLAS_INCLUDE} ${JANSSON_INCLUDE})
  # <ck.h> as a host includes it; -idirafter so vm/ never shadows a system header
  target_compile_options(ck_fuzz_objs PUBLIC "SHELL:-iquote ${CMAKE_SOURCE_DIR}/vm"
    "SHELL:-idirafter ${CMAKE_SOURCE_DIR}/vm" ${CK_FUZZ_FLAGS} -fsanitize=fuzzer-no-link)
  target_compile_definitions(ck_fuzz_objs PRIVATE CK_STDLIB_DIR="${CMAKE_SOURCE_DIR}/stdlib")
  target_link_libraries(ck_fuzz_objs PUBLIC OpenMP::OpenMP_C)

  # the safetensors reader needs only its own file and the JSON helper (jansson)
  add_executable(fuzz_safetensors EXCLUDE_FROM_ALL tests/fuzz/fuzz_safetensors.c vm/formats/safetensors.c vm/formats/json.c vm/util/atomic.c vm/util/budget.c vm/util/text.c vm/util/memory.c)
  target_compile_options(fuzz_safetensors PRIVATE "SHELL:-iquote ${CMAKE_SOURCE_DIR}/vm" ${CK_FUZZ_FLAGS} -fsanitize=fuzzer)
  target_include_directories(fuzz_safetensors PRIVATE ${JANSSON_INCLUDE})
  target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_safetensors PRIVATE ${JANSSON_LIB} m)

  # the image readers: their own file, and Debian's libpng, libjpeg and libwebp
  # (uninstrumented: what the runtime links)
  add_executable(fuzz_image EXCLUDE_FROM_ALL tests/fuzz/fuzz_image.c vm/formats/image.c vm/util/atomic.c vm/util/budget.c vm/util/text.c)
  target_compile_options(fuzz_image PRIVATE "SHELL:-iquote ${CMAKE_SOURCE_DIR}/vm" ${CK_FUZZ_FLAGS} -fsanitize=fuzzer)
  target_include_directories(fuzz_image PRIVATE ${PNG_INCLUDE} ${JPEG_INCLUDE} ${WEBP_INCLUDE})
  target_link_options(fuzz_image PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_image PRIVATE ${PNG_LIB} ${JPEG_LIB} ${WEBP_LIB} Threads::Threads m)

  # the tokenizer's readers: its own files, jansson, ICU and zlib
  add_executable(fuzz_tokenizer EXCLUDE_FROM_ALL tests/fuzz/fuzz_tokenizer.c vm/text/clip_bpe.c vm/text/ftfy.c vm/text/text_file.c
                 vm/util/text.c vm/util/memory.c)
  target_compile_options(fuzz_tokenizer PRIVATE "SHELL:-iquote ${CMAKE_SOURCE_DIR}/vm" ${CK_FUZZ_FLAGS} -fsanitize=fuzzer)
  target_include_directories(fuzz_tokenizer PRIVATE ${JANSSON_INCLUDE} ${ICU_INCLUDE})
  target_link_options(fuzz_tokenizer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_tokenizer PRIVATE ${JANSSON_LIB} ${ICUUC_LIB} ${ZLIB_LIB} Threads::Threads m)

  foreach(h fuzz_script fuzz_dataset fuzz_checkpoint)
    add_executable(${h} EXCLUDE_FROM_ALL tests/fuzz/${h}.c $<TARGET_OBJECTS:ck_fuzz_objs>)
    target_compile_options(${h} PRIVATE ${CK_FUZZ_FLAGS} -fsanitize=fuzzer)
    target_include_directories(${h} PRIVATE ${LUA_INCLUDE_DIRS} ${CBLAS_INCLUDE} ${JANSSON_INCLUDE})
    target_compile_options(${h} PRIVATE "SHELL:-idirafter ${CMAKE_SOURCE_DIR}/vm")
    target_link_options(${h} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(${h} PRIVATE ${LUA_LINK_LIBRARIES} ${OPENBLAS_LIB} ${JANSSON_LIB} ${ICUUC_LIB} ${ZLIB_LIB} OpenMP::OpenMP_C Threads::Threads m)
  endforeach()
  # the sentencepiece model reader and the T5 tokenizer's pipeline, with the
  # shim over Debian's libsentencepiece (itself uninstrumented)
  add_executable(fuzz_spm EXCLUDE_FROM_ALL tests/fuzz/fuzz_spm.c vm/text/spm_model.c vm/text/spm_tok.c vm/text/spm_shim.cc
                 vm/util/text.c)
  target_compile_options(fuzz_spm PRIVATE "SHELL:-iquote ${CMAKE_SOURCE_DIR}/vm" ${CK_FUZZ_FLAGS} -fsanitize=fuzzer)
  target_include_directories(fuzz_spm PRIVATE ${JANSSON_INCLUDE} ${ICU_INCLUDE} ${SPM_INCLUDE_DIRS})
  target_link_options(fuzz_spm PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_spm PRIVATE ${JANSSON_LIB} ${ICUUC_LIB} ${CK_SPM_LINK} m)
  # the TOML reader: ckrun's scan, then toml++ behind its shim, compiled in
  # header-only here too, so its own code is instrumented and covered
  add_executable(fuzz_toml EXCLUDE_FROM_ALL tests/fuzz/fuzz_toml.c vm/formats/toml_scan.c vm/formats/toml_shim.cc
                 vm/formats/json.c vm/text/text_file.c vm/util/text.c vm/util/memory.c)
  target_compile_options(fuzz_toml PRIVATE "SHELL:-iquote ${CMAKE_SOURCE_DIR}/vm" ${CK_FUZZ_FLAGS} -fsanitize=fuzzer)
  target_include_directories(fuzz_toml PRIVATE ${JANSSON_INCLUDE} ${TOMLPP_INCLUDE})
  target_link_options(fuzz_toml PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_toml PRIVATE ${JANSSON_LIB} ${ZLIB_LIB} stdc++ m)
  add_custom_target(fuzz_harnesses DEPENDS fuzz_safetensors fuzz_script fuzz_dataset fuzz_checkpoint fuzz_image
                    fuzz_tokenizer fuzz_spm fuzz_toml)
endif()
