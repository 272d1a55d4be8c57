// src/io/pickle_scan.h: the walk over a pickle's opcodes that refuses what would make LibTorch's
// unpickler allocate memory the bytes do not hold.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <c10/util/Exception.h>

#include "io/pickle_scan.h"

namespace {

using ::testing::HasSubstr;

std::string error_of(const std::string& pickle) {
  try {
    mantissa::io::check_pickle_is_bounded(pickle.data(), pickle.size(), "x.pkl");
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

// PROTO 2 first, as every pickle LibTorch reads begins.
std::string pickle(const std::string& body) { return std::string("\x80\x02", 2) + body; }

TEST(PickleScanTest, AcceptsWhatPicklersWrite) {
  // {'cpu': []} as Python's protocol 2 writes it, memo ids 0, 1, 2 in order.
  EXPECT_EQ(error_of(pickle(std::string("}q\x00X\x03\x00\x00\x00" "cpuq\x01]q\x02s.", 19))),
            "(no error)");
  // A memo entry stored again, and one more after it.
  EXPECT_EQ(error_of(pickle(std::string("}q\x00q\x00]r\x01\x00\x00\x00\x30.", 13))),
            "(no error)");
  EXPECT_EQ(error_of(pickle("ctorch\nFloatStorage\n.")), "(no error)");
}

TEST(PickleScanTest, RefusesAMemoIdPastTheNextOne) {
  EXPECT_THAT(error_of(pickle("}r\xff\xff\xff\x7f.")),
              HasSubstr("x.pkl stores memo entry 2147483647 at byte 3 of its pickle while only 0 "
                        "entries exist"));
  EXPECT_THAT(error_of(pickle(std::string("}q\x00]q\x02.", 7))),
              HasSubstr("stores memo entry 2 at byte 6 of its pickle while only 1 entries exist"));
}

TEST(PickleScanTest, RefusesALengthLongerThanWhatFollows) {
  EXPECT_THAT(error_of(pickle("X\xf0\xff\xff\xff" "cpu.")),
              HasSubstr("x.pkl claims 4294967280 bytes for the argument of its pickle opcode 0x58 "
                        "at byte 2, but only 4 bytes follow"));
  EXPECT_THAT(error_of(pickle("\x8d\xff\xff\xff\xff\xff\xff\xff\xff" "ab.")),
              HasSubstr("claims 18446744073709551615 bytes for the argument of its pickle opcode "
                        "0x8d"));
  EXPECT_THAT(error_of(pickle("\x8a\x08\x01\x02")), HasSubstr("claims 8 bytes"));
  // Exactly the bytes that follow is fine: the unpickler finds STOP missing on its own.
  EXPECT_EQ(error_of(pickle(std::string("X\x02\x00\x00\x00" "ab", 7))), "(no error)");
}

TEST(PickleScanTest, RefusesAnArgumentCutByTheEnd) {
  EXPECT_THAT(error_of(pickle("J\x01\x02")),
              HasSubstr("x.pkl is cut inside the argument of its pickle opcode 0x4a at byte 2"));
  EXPECT_THAT(error_of(pickle("X\x01")), HasSubstr("opcode 0x58 at byte 2"));
  EXPECT_THAT(error_of(pickle("ctorch\nFloatStorage")), HasSubstr("opcode 0x63 at byte 2"));
  EXPECT_THAT(error_of(std::string("\x80", 1)), HasSubstr("opcode 0x80 at byte 0"));
}

TEST(PickleScanTest, StopsAtStopAndAtABytesThatIsNoOpcode) {
  // What follows STOP, or a byte that is no opcode (the unpickler refuses it), is not read.
  EXPECT_EQ(error_of(pickle(".r\xff\xff\xff\x7f")), "(no error)");
  EXPECT_EQ(error_of(pickle("\xffr\xff\xff\xff\x7f")), "(no error)");
  EXPECT_EQ(error_of(""), "(no error)");
}

}  // namespace
