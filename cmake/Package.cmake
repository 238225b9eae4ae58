# The library as a package: `cmake --install` puts the headers, the libraries, the programs and the GPT-2
# vocabulary under the prefix, and another CMake project then uses it with
#   find_package(dptrain REQUIRED)
#   target_link_libraries(app PRIVATE dptrain::dptrain)
# or, from a source tree, add_subdirectory(dptrain) and the same target_link_libraries line.
include(CMakePackageConfigHelpers)

# dptrain::dptrain: every library of the project (what dptrain.h includes).
add_library(dptrain INTERFACE)
target_link_libraries(dptrain INTERFACE dpt_core dpt_layers dpt_optim dpt_rendezvous dpt_collectives dpt_distributed dpt_data)
add_library(dptrain::dptrain ALIAS dptrain)

set(_dpt_libraries dpt_core dpt_layers dpt_optim dpt_rendezvous dpt_collectives dpt_distributed dpt_data)
foreach(_lib ${_dpt_libraries})
  string(REGEX REPLACE "^dpt_" "" _short ${_lib})
  set_target_properties(${_lib} PROPERTIES EXPORT_NAME ${_short})  # dptrain::core, dptrain::layers, ...
endforeach()
set(_dpt_exported dptrain ${_dpt_libraries})
if(DPT_HAVE_CUDA)
  list(APPEND _dpt_exported dpt_cudnn dpt_nccl)
endif()

install(TARGETS ${_dpt_exported} EXPORT dptrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT dptrainTargets NAMESPACE dptrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dptrain)

# Headers keep the source layout under include/dptrain, so "core/tensor.h" means the same in both.
install(FILES ${PROJECT_SOURCE_DIR}/dptrain.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dptrain)
foreach(_folder core layers optim rendezvous collectives distributed data)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_folder}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dptrain/${_folder}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.inc" PATTERN "*.cuh" PATTERN "corpus" EXCLUDE PATTERN "gpt2" EXCLUDE)
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/data/gpt2/ DESTINATION ${CMAKE_INSTALL_DATADIR}/dptrain/gpt2)

foreach(_program dpt-train dpt-run dpt-bench dpt-generate dpt-tokenize)
  if(TARGET ${_program})
    install(TARGETS ${_program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

set(DPT_PACKAGE_HAS_CUDA ${DPT_HAVE_CUDA})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dptrainConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/dptrainConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dptrain)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dptrainConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dptrainConfig.cmake ${PROJECT_BINARY_DIR}/dptrainConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dptrain)
