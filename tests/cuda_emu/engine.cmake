# The CPU execution engine for dtrain's CUDA code (DTRAIN_CUDA=EMU only): the runtime,
# kernel executor, cuBLASLt and NCCL subsets as one static library whose include dir
# supplies cuda_runtime.h, cuda_bf16.h, cuda_fp16.h, cublasLt.h and nccl.h. Test-only.
file(GLOB cuda_emu_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
list(FILTER cuda_emu_srcs EXCLUDE REGEX "_test\\.cpp$")
add_library(dtrain_cuda_emu STATIC ${cuda_emu_srcs})
target_include_directories(dtrain_cuda_emu PUBLIC ${CMAKE_CURRENT_LIST_DIR}/include
                                           PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_compile_definitions(dtrain_cuda_emu PUBLIC DTRAIN_CUDA_EMU=1)
target_compile_options(dtrain_cuda_emu PRIVATE -Wall -Wextra)
target_link_libraries(dtrain_cuda_emu PUBLIC Boost::context Threads::Threads ${CMAKE_DL_LIBS})
# One translation unit per 8 files, as lib/'s modules (dtrain_add_module): the engine's files
# share the runtime's and executor's headers.
if(DTRAIN_UNITY_BUILD)
  set_target_properties(dtrain_cuda_emu PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  target_compile_options(dtrain_cuda_emu PRIVATE -Wno-subobject-linkage)
endif()
# Compile options that let the engine's racecheck see a file's memory accesses (GCC's
# ThreadSanitizer instrumentation calling the engine's own hooks, racecheck.cpp).
set(DTRAIN_EMU_RACECHECK_FLAGS -fsanitize=thread --param=tsan-instrument-func-entry-exit=0)
