#pragma once
// TensorBoard's event files, written without TensorFlow or protobuf: the few fields scalars need.
//
// A file is a sequence of records, each
//   uint64 length | uint32 masked CRC-32C of the 8 length bytes | data | uint32 masked CRC-32C of data
// (little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), and each record's data is one
// serialized tensorflow.Event:
//   Event      { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//                SessionLog session_log = 6; }
//   Summary    { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
//   SessionLog { SessionStatus status = 1; }   (START = 1)
// The first event of a file carries file_version "brain.Event:2".
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dpt::train::tfevents {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord frames use it.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

// The serialized Events.
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values);
// SessionLog START at `step`: TensorBoard drops the events of `step` and later that earlier files of the
// same directory hold (what a resumed run rewrites).
std::string session_start_event(double wall_time, int64_t step);

// One framed record holding `data`.
std::string record(const std::string& data);

}  // namespace dpt::train::tfevents
