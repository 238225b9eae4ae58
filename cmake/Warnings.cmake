# dpt_set_warnings(target): the project's warning level on our own sources (never on third-party headers).
function(dpt_set_warnings target)
  set(_cxx_flags -Wall -Wextra -Wno-unused-parameter)
  if(DPT_WERROR)
    list(APPEND _cxx_flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${_cxx_flags}>)
  if(DPT_HAVE_CUDA)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall>)
  endif()
endfunction()

# dpt_glue_optimization(target TEST|PROGRAM): tests, and in the sanitizer build the programs, are glue
# around the libraries, which keep the build's optimisation level: the code under test runs as built. The
# glue is compiled at a lower level because a clean build is mostly test and program sources (GoogleTest,
# CLI11 and JSON instantiated in every file) and the optimiser takes most of their compile time; one level
# down roughly halves it (docs/testing.md). Release: tests at -O1; sanitizer build (libraries at -O1):
# tests and programs at -O0.
function(dpt_glue_optimization target kind)
  if(DPT_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>)
  elseif(kind STREQUAL "TEST")
    target_compile_options(${target} PRIVATE $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release>>:-O1>)
  endif()
endfunction()

if(DPT_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined> $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=address,undefined)
endif()

# dpt_folder_library(NAME folder DEPS ...): one library per folder, from every .cpp in it (and its .cu
# files when CUDA is on), so CMake enforces the dependency arrows of DESIGN.md.
function(dpt_folder_library name)
  cmake_parse_arguments(ARG "" "" "DEPS;CUDA_DEPS" ${ARGN})
  file(GLOB _sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp ${CMAKE_CURRENT_SOURCE_DIR}/*/*.cpp)
  if(DPT_HAVE_CUDA)
    file(GLOB _cuda_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cu ${CMAKE_CURRENT_SOURCE_DIR}/*/*.cu)
    list(APPEND _sources ${_cuda_sources})
  endif()
  if(_sources)
    add_library(${name} ${_sources})
    target_link_libraries(${name} PUBLIC ${ARG_DEPS})
    if(DPT_HAVE_CUDA AND ARG_CUDA_DEPS)
      target_link_libraries(${name} PUBLIC ${ARG_CUDA_DEPS})
    endif()
    dpt_set_warnings(${name})
  else()
    add_library(${name} INTERFACE)
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
  endif()
endfunction()
