# Install rules: ckrun, libck (static and shared), ck.h, ck.pc, ck.so where a
# stock lua5.4 looks for C modules and the stdlib where it looks for Lua ones,
# so that after `cmake --install build` (or `make install`)
# `lua5.4 -e 'require "ck.nn"'` and `cc host.c $(pkg-config --cflags --libs ck)`
# need no extra paths.
include(GNUInstallDirs)

# lua5.4's default package.cpath and package.path hold PREFIX/lib/lua/5.4/?.so
# and PREFIX/share/lua/5.4/?.lua for PREFIX /usr/local and /usr.
set(CK_LUA_CMOD_DIR lib/lua/5.4)
set(CK_LUA_LMOD_DIR share/lua/5.4)

# The stdlib a VM loads: beside an installed libck or ckrun (PREFIX/share/lua/5.4,
# found at run time, so `cmake --install --prefix` may move it), else the source
# tree's, else the configured prefix's (vm/embed/ck.c, default_stdlib).
target_compile_definitions(ck_objs PRIVATE CK_STDLIB_INSTALL_DIR="${CMAKE_INSTALL_PREFIX}/${CK_LUA_LMOD_DIR}")

# installed binaries keep finding the OpenMP build of OpenBLAS
get_filename_component(CK_OPENBLAS_DIR ${OPENBLAS_LIB} DIRECTORY)
get_filename_component(CK_JANSSON_DIR ${JANSSON_LIB} DIRECTORY)
set_target_properties(ckrun ck_shared ck_module PROPERTIES INSTALL_RPATH "${CK_OPENBLAS_DIR}")

install(TARGETS ckrun RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ck_static ck_shared
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ck_module LIBRARY DESTINATION ${CK_LUA_CMOD_DIR})
install(FILES vm/ck.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY stdlib/ck DESTINATION ${CK_LUA_LMOD_DIR} FILES_MATCHING PATTERN "*.lua")

# the CUDA backend beside libck, where vm/run/cuda_loader.c looks for it
if(CK_CUDA_FOUND)
  get_filename_component(cudnn_dir ${CUDNN_LIBRARY} DIRECTORY)
  set_target_properties(ck_cuda_module PROPERTIES INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR};${cudnn_dir}")
  install(TARGETS ck_cuda_module LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  target_compile_definitions(ck_objs PRIVATE CK_CUDA_INSTALL_DIR="${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}")
endif()

# a static libck links MPI where it was built with it (CMakeLists.txt)
set(CK_PC_MPI "")
if(MPI_C_FOUND)
  string(JOIN " " CK_PC_MPI ${MPI_C_LIBRARIES})
endif()

# ck.pc is written at install time, for the prefix given then
install(CODE "
  set(prefix \"\${CMAKE_INSTALL_PREFIX}\")
  set(libdir \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}\")
  set(includedir \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}\")
  set(version \"${PROJECT_VERSION}\")
  set(openblas \"-L${CK_OPENBLAS_DIR} -lopenblas\")
  set(jansson \"-L${CK_JANSSON_DIR} -ljansson\")
  set(mpi \"${CK_PC_MPI}\")
  set(cbc \"${CBC_LIB}\")
  string(MD5 ck_pc_tag \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${CMAKE_SOURCE_DIR}/cmake/ck.pc.in\" \"${CMAKE_BINARY_DIR}/ck-\${ck_pc_tag}.pc\" @ONLY)
  file(INSTALL \"${CMAKE_BINARY_DIR}/ck-\${ck_pc_tag}.pc\"
       DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig\" RENAME ck.pc)
  file(REMOVE \"${CMAKE_BINARY_DIR}/ck-\${ck_pc_tag}.pc\")
")

# the dynamic loader learns of a new libck.so in a system prefix
install(CODE "
  if(\"\$ENV{DESTDIR}\" STREQUAL \"\" AND (\"\${CMAKE_INSTALL_PREFIX}\" STREQUAL \"/usr/local\" OR
     \"\${CMAKE_INSTALL_PREFIX}\" STREQUAL \"/usr\") AND EXISTS /sbin/ldconfig)
    execute_process(COMMAND /sbin/ldconfig OUTPUT_QUIET ERROR_QUIET)
  endif()
")
