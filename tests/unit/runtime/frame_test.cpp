// Length-prefixed framing: the incremental decoder non-blocking readers use
// and the blocking helpers over a real socketpair/pipe.
#include "runtime/frame.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace dsec {
namespace {

// A payload whose every byte depends on its index and a seed, so a frame
// shifted or cut anywhere compares unequal.
std::string Pattern(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed * 7 + (i >> 8)) & 0xff);
  return s;
}

void FeedString(FrameDecoder* d, const std::string& s) { d->Feed(s.data(), s.size()); }

// Both ends closed by the destructor; each end can be closed early.
class SocketPair {
 public:
  SocketPair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0) {
      a_ = fds[0];
      b_ = fds[1];
    }
  }
  ~SocketPair() {
    CloseA();
    CloseB();
  }
  bool ok() const { return a_ >= 0 && b_ >= 0; }
  int a() const { return a_; }
  int b() const { return b_; }
  void CloseA() {
    if (a_ >= 0) ::close(a_);
    a_ = -1;
  }
  void CloseB() {
    if (b_ >= 0) ::close(b_);
    b_ = -1;
  }

 private:
  int a_ = -1, b_ = -1;
};

TEST(AppendFrameTest, WritesLittleEndianLengthThenPayload) {
  std::string out = "x";  // appends, never replaces
  AppendFrame(&out, "hello");
  ASSERT_EQ(out.size(), 1u + 4u + 5u);
  EXPECT_EQ(out.substr(0, 1), "x");
  EXPECT_EQ(out.substr(1, 4), std::string("\x05\x00\x00\x00", 4));
  EXPECT_EQ(out.substr(5), "hello");

  std::string big;
  AppendFrame(&big, std::string(0x010203, 'a'));
  EXPECT_EQ(big.substr(0, 4), std::string("\x03\x02\x01\x00", 4));
  EXPECT_EQ(big.size(), 4u + 0x010203u);
}

TEST(AppendFrameTest, EmptyPayloadIsJustTheHeader) {
  std::string out;
  AppendFrame(&out, "");
  EXPECT_EQ(out, std::string(4, '\0'));
}

TEST(FrameDecoderTest, EmptyDecoderNeedsMoreBytes) {
  FrameDecoder d;
  std::string f = "untouched";
  EXPECT_EQ(d.Next(&f), 0);
  EXPECT_EQ(f, "untouched");
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoderTest, DecodesOneFrameFedByteByByte) {
  std::string wire;
  const std::string payload = Pattern(300, 1);
  AppendFrame(&wire, payload);

  FrameDecoder d;
  std::string f;
  for (size_t i = 0; i + 1 < wire.size(); ++i) {
    d.Feed(&wire[i], 1);
    ASSERT_EQ(d.Next(&f), 0) << "a frame came out after only " << i + 1 << " of " << wire.size()
                             << " bytes";
    EXPECT_EQ(d.buffered(), i + 1);
  }
  d.Feed(&wire.back(), 1);
  ASSERT_EQ(d.Next(&f), 1);
  EXPECT_EQ(f, payload);
  EXPECT_EQ(d.buffered(), 0u);
  EXPECT_EQ(d.Next(&f), 0);
}

TEST(FrameDecoderTest, SeveralFramesByteByByte) {
  std::vector<std::string> sent = {"a", "", Pattern(70, 2), "last"};
  std::string wire;
  for (const auto& s : sent) AppendFrame(&wire, s);

  FrameDecoder d;
  std::vector<std::string> got;
  std::string f;
  for (char c : wire) {
    d.Feed(&c, 1);
    int r;
    while ((r = d.Next(&f)) == 1) got.push_back(f);
    ASSERT_EQ(r, 0);
  }
  EXPECT_EQ(got, sent);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoderTest, SeveralFramesInOneFeed) {
  std::string wire;
  AppendFrame(&wire, "one");
  AppendFrame(&wire, "two");
  AppendFrame(&wire, "three");
  const std::string tail_payload = "four";
  std::string tail;
  AppendFrame(&tail, tail_payload);
  wire += tail.substr(0, 6);  // header and two bytes of the fourth frame

  FrameDecoder d;
  FeedString(&d, wire);
  std::string f;
  ASSERT_EQ(d.Next(&f), 1);
  EXPECT_EQ(f, "one");
  ASSERT_EQ(d.Next(&f), 1);
  EXPECT_EQ(f, "two");
  ASSERT_EQ(d.Next(&f), 1);
  EXPECT_EQ(f, "three");
  EXPECT_EQ(d.Next(&f), 0);
  EXPECT_EQ(d.buffered(), 6u);

  d.Feed(tail.data() + 6, tail.size() - 6);
  ASSERT_EQ(d.Next(&f), 1);
  EXPECT_EQ(f, tail_payload);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoderTest, ZeroLengthFrame) {
  std::string wire;
  AppendFrame(&wire, "");
  FrameDecoder d;
  FeedString(&d, wire);
  std::string f = "stale";
  ASSERT_EQ(d.Next(&f), 1);
  EXPECT_EQ(f, "");  // the output is replaced, not appended to
  EXPECT_EQ(d.buffered(), 0u);
  EXPECT_EQ(d.Next(&f), 0);
}

TEST(FrameDecoderTest, LengthAtTheMaximumIsAccepted) {
  FrameDecoder d(/*max_frame=*/8);
  std::string wire;
  AppendFrame(&wire, "12345678");
  FeedString(&d, wire);
  std::string f;
  ASSERT_EQ(d.Next(&f), 1);
  EXPECT_EQ(f, "12345678");
}

TEST(FrameDecoderTest, OversizeLengthIsAnErrorAsSoonAsTheHeaderArrives) {
  FrameDecoder d(/*max_frame=*/8);
  std::string wire;
  AppendFrame(&wire, "123456789");
  d.Feed(wire.data(), 3);
  std::string f;
  EXPECT_EQ(d.Next(&f), 0);  // the length is not known yet
  d.Feed(wire.data() + 3, 1);
  EXPECT_EQ(d.Next(&f), -1);  // no need to wait for a payload that is refused anyway
  EXPECT_EQ(d.Next(&f), -1);  // and the stream stays unusable
}

TEST(FrameDecoderTest, DefaultMaximumIsKMaxFrameBytes) {
  FrameDecoder d;
  const uint32_t len = kMaxFrameBytes + 1;
  char hdr[4];
  for (int i = 0; i < 4; ++i) hdr[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  d.Feed(hdr, 4);
  std::string f;
  EXPECT_EQ(d.Next(&f), -1);
}

// Pushes well over the 64 KiB compaction threshold through one decoder in
// chunks that never line up with frame boundaries, so the buffer is compacted
// with a partial frame still in it; every frame must come out intact and in
// order, and the decoder must not hold more than the unfinished frame.
TEST(FrameDecoderTest, CompactionKeepsFramesIntactAcrossManyFrames) {
  std::vector<std::string> sent;
  std::string wire;
  for (unsigned i = 0; i < 3000; ++i) {
    sent.push_back(Pattern((i * 977) % 5000, i));
    AppendFrame(&wire, sent.back());
  }
  ASSERT_GT(wire.size(), 4u << 20);

  FrameDecoder d;
  std::vector<std::string> got;
  std::string f;
  size_t off = 0, chunk_no = 0;
  size_t max_buffered = 0;
  while (off < wire.size()) {
    size_t chunk = 1 + (chunk_no++ * 7919) % 20000;  // 1 .. 20000 bytes, irregular
    chunk = std::min(chunk, wire.size() - off);
    d.Feed(wire.data() + off, chunk);
    off += chunk;
    int r;
    while ((r = d.Next(&f)) == 1) got.push_back(f);
    ASSERT_EQ(r, 0);
    max_buffered = std::max(max_buffered, d.buffered());
  }
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) ASSERT_EQ(got[i], sent[i]) << "frame " << i;
  EXPECT_EQ(d.buffered(), 0u);
  // What is left unconsumed is never more than one frame plus one chunk.
  EXPECT_LE(max_buffered, 4u + 5000u + 20000u);
}

TEST(FrameDecoderTest, CompactionWithLargeFramesAndASmallTail) {
  // A big frame consumed while a few bytes of the next one are buffered
  // forces the erase path (pos > 64 KiB, consumed prefix dominates).
  FrameDecoder d;
  std::string f;
  for (unsigned round = 0; round < 20; ++round) {
    std::string wire;
    const std::string big = Pattern(200'000 + round, round);
    const std::string small = Pattern(10 + round, round + 100);
    AppendFrame(&wire, big);
    AppendFrame(&wire, small);
    const size_t cut = wire.size() - 3;  // keep the last 3 bytes of `small` back
    d.Feed(wire.data(), cut);
    ASSERT_EQ(d.Next(&f), 1);
    ASSERT_EQ(f, big) << "round " << round;
    ASSERT_EQ(d.Next(&f), 0);
    EXPECT_EQ(d.buffered(), 4u + small.size() - 3u);
    d.Feed(wire.data() + cut, 3);
    ASSERT_EQ(d.Next(&f), 1);
    ASSERT_EQ(f, small) << "round " << round;
    EXPECT_EQ(d.buffered(), 0u);
  }
}

TEST(BlockingFrameTest, RoundTripOverSocketPair) {
  SocketPair sp;
  ASSERT_TRUE(sp.ok()) << "socketpair: " << strerror(errno);
  ASSERT_EQ(WriteFrame(sp.a(), "hello"), 0);
  ASSERT_EQ(WriteFrame(sp.a(), ""), 0);
  ASSERT_EQ(WriteFrame(sp.a(), std::string("bin\0ary", 7)), 0);

  std::string p = "stale";
  ASSERT_EQ(ReadFrame(sp.b(), &p), 0);
  EXPECT_EQ(p, "hello");
  ASSERT_EQ(ReadFrame(sp.b(), &p), 0);
  EXPECT_EQ(p, "");
  ASSERT_EQ(ReadFrame(sp.b(), &p), 0);
  EXPECT_EQ(p, std::string("bin\0ary", 7));
}

TEST(BlockingFrameTest, FrameLargerThanThePipeBufferCrossesInPieces) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0) << strerror(errno);
  const std::string payload = Pattern(3 << 20, 9);  // far above a pipe's 64 KiB
  int write_err = -1;
  std::thread writer([&] {
    write_err = WriteFrame(fds[1], payload);
    ::close(fds[1]);
  });
  std::string got;
  int read_err = ReadFrame(fds[0], &got);
  writer.join();
  EXPECT_EQ(write_err, 0);
  ASSERT_EQ(read_err, 0);
  EXPECT_EQ(got.size(), payload.size());
  EXPECT_TRUE(got == payload);
  // The writer closed its end after the frame: the next read is a clean EOF.
  EXPECT_EQ(ReadFrame(fds[0], &got), ENODATA);
  ::close(fds[0]);
}

TEST(BlockingFrameTest, CleanEofBeforeAFrameIsEnodata) {
  SocketPair sp;
  ASSERT_TRUE(sp.ok());
  sp.CloseA();
  std::string p;
  EXPECT_EQ(ReadFrame(sp.b(), &p), ENODATA);
}

TEST(BlockingFrameTest, EofAfterWholeFramesIsEnodata) {
  SocketPair sp;
  ASSERT_TRUE(sp.ok());
  ASSERT_EQ(WriteFrame(sp.a(), "only"), 0);
  sp.CloseA();
  std::string p;
  ASSERT_EQ(ReadFrame(sp.b(), &p), 0);
  EXPECT_EQ(p, "only");
  EXPECT_EQ(ReadFrame(sp.b(), &p), ENODATA);
}

TEST(BlockingFrameTest, EofInsideTheHeaderIsEpipe) {
  SocketPair sp;
  ASSERT_TRUE(sp.ok());
  ASSERT_EQ(WriteFull(sp.a(), "\x05\x00", 2), 0);
  sp.CloseA();
  std::string p;
  EXPECT_EQ(ReadFrame(sp.b(), &p), EPIPE);
}

TEST(BlockingFrameTest, EofRightAfterTheHeaderIsEpipe) {
  SocketPair sp;
  ASSERT_TRUE(sp.ok());
  ASSERT_EQ(WriteFull(sp.a(), "\x05\x00\x00\x00", 4), 0);
  sp.CloseA();
  std::string p;
  // Not ENODATA: the peer promised 5 bytes and sent none of them.
  EXPECT_EQ(ReadFrame(sp.b(), &p), EPIPE);
}

TEST(BlockingFrameTest, EofInsideThePayloadIsEpipe) {
  SocketPair sp;
  ASSERT_TRUE(sp.ok());
  std::string wire;
  AppendFrame(&wire, "truncated payload");
  ASSERT_EQ(WriteFull(sp.a(), wire.data(), wire.size() - 5), 0);
  sp.CloseA();
  std::string p;
  EXPECT_EQ(ReadFrame(sp.b(), &p), EPIPE);
}

TEST(BlockingFrameTest, OversizedLengthIsEmsgsize) {
  SocketPair sp;
  ASSERT_TRUE(sp.ok());
  ASSERT_EQ(WriteFrame(sp.a(), "123456789"), 0);
  std::string p;
  EXPECT_EQ(ReadFrame(sp.b(), &p, /*max_frame=*/8), EMSGSIZE);

  // With the default maximum: a header claiming kMaxFrameBytes + 1.
  const uint32_t len = kMaxFrameBytes + 1;
  char hdr[4];
  for (int i = 0; i < 4; ++i) hdr[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  SocketPair sp2;
  ASSERT_TRUE(sp2.ok());
  ASSERT_EQ(WriteFull(sp2.a(), hdr, 4), 0);
  EXPECT_EQ(ReadFrame(sp2.b(), &p), EMSGSIZE);
}

TEST(BlockingFrameTest, ErrorsOnBadFdAreReturnedNotThrown) {
  std::string p;
  EXPECT_EQ(ReadFrame(-1, &p), EBADF);
  EXPECT_EQ(WriteFrame(-1, "x"), EBADF);
}

}  // namespace
}  // namespace dsec
