# Dependencies: Debian 12 packages only (scripts/dev installs them).
find_package(Threads REQUIRED)

# CAF 0.17.6 ships no CMake package: imported targets by hand (names as CAF >= 0.18).
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
find_library(CAF_IO_LIBRARY caf_io REQUIRED)
add_library(CAF::core SHARED IMPORTED)
set_target_properties(CAF::core PROPERTIES
  IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES Threads::Threads)
add_library(CAF::io SHARED IMPORTED)
set_target_properties(CAF::io PROPERTIES
  IMPORTED_LOCATION "${CAF_IO_LIBRARY}" INTERFACE_LINK_LIBRARIES CAF::core)

find_package(OpenSSL REQUIRED)          # OpenSSL::Crypto (HMAC of the SDK's handshake), OpenSSL::SSL
# CAF's OpenSSL module (--tls): its sessions carry BASP behind the door.
find_library(CAF_OPENSSL_LIBRARY caf_openssl REQUIRED)
add_library(CAF::openssl SHARED IMPORTED)
set_target_properties(CAF::openssl PROPERTIES
  IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}" INTERFACE_LINK_LIBRARIES "CAF::io;OpenSSL::SSL")
find_package(spdlog CONFIG REQUIRED)     # spdlog::spdlog (external fmt)
find_package(RocksDB CONFIG REQUIRED)    # RocksDB::rocksdb-shared
find_package(Protobuf REQUIRED)          # protobuf::libprotobuf, protoc
find_package(GTest CONFIG REQUIRED)      # GTest::gtest, GTest::gtest_main
find_package(benchmark CONFIG REQUIRED)  # benchmark::benchmark
find_package(nlohmann_json CONFIG REQUIRED)  # nlohmann_json::nlohmann_json
find_package(CLI11 CONFIG REQUIRED)      # CLI11::CLI11
find_package(Boost 1.74 REQUIRED)       # Boost::headers (Beast and Asio: the HTTP server, runtime/http_server.hpp)

find_library(SECCOMP_STATIC libseccomp.a REQUIRED)
find_library(PROTOBUF_LITE_STATIC libprotobuf-lite.a REQUIRED)

# dsec_protobuf(<target> <import_dir> <proto>...): generates C++ for each proto
# into build/gen, keeping the path below <import_dir>, so "dsec/v1/types.proto"
# is included as "dsec/v1/types.pb.h" everywhere.
set(DSEC_GEN_DIR ${CMAKE_BINARY_DIR}/gen)
file(MAKE_DIRECTORY ${DSEC_GEN_DIR})
function(dsec_protobuf target import_dir)
  set(srcs)
  foreach(proto ${ARGN})
    get_filename_component(proto ${proto} ABSOLUTE)
    file(RELATIVE_PATH rel ${import_dir} ${proto})
    string(REGEX REPLACE "\\.proto$" "" base ${rel})
    add_custom_command(
      OUTPUT ${DSEC_GEN_DIR}/${base}.pb.cc ${DSEC_GEN_DIR}/${base}.pb.h
      COMMAND ${Protobuf_PROTOC_EXECUTABLE} --cpp_out=${DSEC_GEN_DIR} -I ${import_dir} ${proto}
      DEPENDS ${proto}
      COMMENT "protoc ${rel}" VERBATIM)
    list(APPEND srcs ${DSEC_GEN_DIR}/${base}.pb.cc ${DSEC_GEN_DIR}/${base}.pb.h)
  endforeach()
  target_sources(${target} PRIVATE ${srcs})
  target_include_directories(${target} PUBLIC ${DSEC_GEN_DIR})
endfunction()
