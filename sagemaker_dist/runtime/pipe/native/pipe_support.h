// What the compiled Pipe-mode reader (pipe_dataset_op.cc) stands on: CRC32C, the epoch counter
// shared with the Python reader (pipe/epochs.py), and the FIFO read with non-blocking large reads.
#ifndef SAGEMAKER_DIST_PIPE_SUPPORT_H_
#define SAGEMAKER_DIST_PIPE_SUPPORT_H_

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/common_shape_fns.h"

#ifndef F_SETPIPE_SZ
#define F_SETPIPE_SZ 1031
#endif

namespace tensorflow {
namespace data {
namespace sagemaker_dist_pipe {

using Status = ::absl::Status;

constexpr size_t kBufferBytes = 1 << 20;     // read size, and the pipe buffer asked for
// An epoch's first greedy read, doubled each read up to kBufferBytes: the first batch of small
// records needs tens of KiB, and copying (and page-faulting) a whole MiB before it delays it.
constexpr size_t kFirstRead = 64 << 10;
constexpr uint64_t kLargeRecord = 32 << 10;  // TFRecords this large are read into their tensor
// A record's claimed length is trusted this far (framing/base.py's READ_STEP): memory for a longer one
// grows only as its bytes come, to at most twice what came, so a short stream claiming 1 GiB costs this.
constexpr size_t kReadStep = 64 << 20;
// The highest max_record_bytes (contract/record_formats.py's ceiling): a length up to it plus a
// frame's few bytes never wraps 64 bits.
constexpr uint64_t kMaxRecordCeiling = uint64_t{1} << 62;
constexpr uint32_t kRecordIOMagic = 0xCED7230A;
constexpr int kPollMs = 50;  // how often a blocked read looks for cancellation or a newer iterator

// ---- CRC32C (Castagnoli), masked as TFRecord stores it ----
struct CrcTable {
  uint32_t t[8][256];
  CrcTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0);
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};
inline const CrcTable& Table() {
  static const CrcTable* table = new CrcTable();
  return *table;
}

inline uint32_t Crc32cSoftware(const char* p, size_t n) {
  const auto& t = Table().t;
  uint32_t c = 0xFFFFFFFFu;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    v ^= c;
    c = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
        t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ static_cast<uint8_t>(*p++)) & 0xFF];
  return ~c;
}

#if defined(__x86_64__)
// The CPU's CRC32C instruction takes 3 cycles and can start one a cycle, so one stream of it runs at
// a third of its speed (about 8 GB/s here, as costly as the kernel's copy out of the pipe; TF 2.21's
// absl::ExtendCrc32c measured 2-4 GB/s). Three lanes of a block run at once, and their CRCs are
// joined by shifting the running one past the next lane: a linear map, applied with 4 tables.

// a * b modulo the CRC32C polynomial, bit-reflected as the register holds it (bit 31 is x^0).
inline uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ 0x82F63B78u : b >> 1;  // b * x
  }
  return product;
}

template <size_t kLane>
struct CrcShift {  // t[k][v]: the register v << 8k after kLane zero bytes, (v << 8k) * x^(8 kLane)
  uint32_t t[4][256];
  // Made with one multiplication an entry, not by running the zero bytes through the instruction for
  // each: 21 us for the 4 KiB lane against 0.8 ms, which a job's first batch used to pay.
  __attribute__((target("sse4.2"))) CrcShift() {
    uint64_t power = 1u << 31;  // x^0, then x^(8 kLane): the register after kLane zero bytes
    for (size_t i = 0; i < kLane; i += 8) power = _mm_crc32_u64(power, 0);
    for (int k = 0; k < 4; ++k)
      for (uint32_t v = 0; v < 256; ++v) t[k][v] = MultiplyModP(v << (8 * k), static_cast<uint32_t>(power));
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

template <size_t kLane>
__attribute__((target("sse4.2"))) inline uint64_t Crc32cLanes(uint64_t c, const char*& p, size_t& n) {
  if (n < 3 * kLane) return c;
  static const CrcShift<kLane>* shift = new CrcShift<kLane>();  // made by the first record this long
  while (n >= 3 * kLane) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t v0, v1, v2;
      memcpy(&v0, p + i, 8);
      memcpy(&v1, p + kLane + i, 8);
      memcpy(&v2, p + 2 * kLane + i, 8);
      c = _mm_crc32_u64(c, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    uint32_t joined = (*shift)(static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1);
    c = (*shift)(joined) ^ static_cast<uint32_t>(c2);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  return c;
}

__attribute__((target("sse4.2"))) inline uint32_t Crc32cHardware(const char* p, size_t n) {
  uint64_t c = 0xFFFFFFFFu;
  c = Crc32cLanes<4096>(c, p, n);
  c = Crc32cLanes<256>(c, p, n);
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, static_cast<uint8_t>(*p++));
  return ~c32;
}
inline const bool kHardwareCrc = __builtin_cpu_supports("sse4.2");
#endif

inline uint32_t Crc32c(const char* p, size_t n) {
#if defined(__x86_64__)
  if (kHardwareCrc) return Crc32cHardware(p, n);
#endif
  return Crc32cSoftware(p, n);
}

inline uint32_t MaskedCrc(const char* p, size_t n) {
  uint32_t c = Crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

inline uint32_t U32(const char* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
inline uint64_t U64(const char* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

inline std::string Quoted(const std::string& s) { return absl::StrCat("'", s, "'"); }

// ---- the epoch counter and the FIFO: the same files and words as pipe/epochs.py and fifo.py ----
inline Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      std::string part = path.substr(0, i);
      if (mkdir(part.c_str(), 0777) != 0 && errno != EEXIST)
        return absl::InternalError(absl::StrCat("cannot create ", part, ": ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// Takes the next epoch of `channel` (undo >= 0: gives epoch `undo` back if it is still the last).
inline Status UpdateEpoch(const std::string& state_dir, const std::string& channel, int64_t undo,
                   int64_t* current) {
  TF_RETURN_IF_ERROR(MakeDirs(state_dir));
  std::string path = state_dir + "/" + channel;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  Status status = absl::OkStatus();
  while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  char text[64] = {0};
  ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  int64_t value = n > 0 ? strtoll(text, nullptr, 10) : 0;
  int64_t next = undo < 0 ? value + 1 : (value == undo + 1 ? undo : value);
  std::string out = std::to_string(next);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, out.data(), out.size(), 0) != static_cast<ssize_t>(out.size()))
    status = absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  flock(fd, LOCK_UN);
  close(fd);
  *current = value;
  return status;
}

inline std::string MissingMessage(const std::string& dir, const std::string& path, float timeout) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  std::string where;
  if (d == nullptr) {
    where = dir + " does not exist";
  } else {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    std::string list;
    for (const auto& name : names) absl::StrAppend(&list, list.empty() ? "" : ", ", name);
    where = absl::StrCat(dir, " holds: ", names.empty() ? "nothing" : list);
  }
  char seconds[32];
  snprintf(seconds, sizeof(seconds), "%g", static_cast<double>(timeout));
  return absl::StrCat(
      "Pipe-mode FIFO ", path, " did not appear within ", seconds, " s (", where,
      "). Check that the channel exists and is in Pipe mode, and that the previous epoch's FIFO was "
      "read to its end and closed (SageMaker creates <channel>_<n+1> only after <channel>_<n> is "
      "closed).");
}

inline bool Cancelled(IteratorContext* ctx) {
  auto* cm = ctx->cancellation_manager();
  return cm != nullptr && cm->IsCancelled();
}

// One iteration's open FIFO. A newer iterator of the same dataset supersedes it: closes its FIFO
// (SageMaker creates the next one only then) and makes its next read an error.
struct Stream {
  std::mutex mu;
  int fd = -1;
  bool superseded = false;
  void Supersede() {
    std::lock_guard<std::mutex> l(mu);
    superseded = true;
    if (fd >= 0) close(fd);
    fd = -1;
  }
  ~Stream() {
    if (fd >= 0) close(fd);
  }
};
// dataset id -> its live iteration (iterators of one PipeModeDataset, its .batch included, share the id)
inline std::mutex live_mu;
inline auto* live = new std::map<int64_t, std::weak_ptr<Stream>>();

struct Config {
  std::string channel, format, state_dir, pipe_dir;
  float timeout;
  int64_t max_skip, batch, interval, id;
  uint64_t max_record;  // the longest record accepted, checked before anything is allocated for it
  bool drop_remainder, benchmark;
};

// One epoch's FIFO (or a regular file standing in for it), read into a growing buffer with
// non-blocking reads: waits poll in short steps, so cancellation and a newer iterator are seen.
class FifoBuffer {
 public:
  std::string path;
  uint64_t offset = 0;  // stream offset of data()
  int64_t bytes_read = 0, chunk = 0;
  bool eof = false;
  std::string channel;

  // Waits up to `timeout` s for `path` to appear, then opens it (blocking no longer than that).
  Status Open(IteratorContext* ctx, std::shared_ptr<Stream> stream, const std::string& dir, float timeout) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    struct stat st;
    while (stat(path.c_str(), &st) != 0) {
      if (std::chrono::steady_clock::now() >= deadline)
        return absl::DeadlineExceededError(MissingMessage(dir, path, timeout));
      if (Cancelled(ctx)) return absl::CancelledError("PipeModeDataset iterator cancelled");
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
    }
    if (!S_ISFIFO(st.st_mode) && !S_ISREG(st.st_mode))
      return absl::FailedPreconditionError(path + " exists but is not a FIFO or a file; remove it");
    int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
    fifo_ = fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
    if (fifo_) fcntl(fd, F_SETPIPE_SZ, static_cast<int>(kBufferBytes));  // best effort
    stream->fd = fd;
    stream_ = std::move(stream);
    buf_.reset(new char[kBufferBytes]);
    cap_ = kBufferBytes;
    return absl::OkStatus();
  }

  bool is_open() const { return stream_ != nullptr; }
  const char* data() const { return buf_.get() + begin_; }
  size_t size() const { return end_ - begin_; }
  void Consume(size_t n) {
    begin_ += n;
    offset += n;
  }

  void Close() {
    if (!stream_) return;
    std::lock_guard<std::mutex> l(stream_->mu);
    if (stream_->fd >= 0) close(stream_->fd);
    stream_->fd = -1;
  }

  // At least `need` bytes buffered (fewer only at the end). Greedy reads fill the buffer; others
  // ask for `need` or 16 bytes (after a large record: its CRC and the next header, not its data).
  // The buffer grows to at most twice the bytes in it, or kReadStep: `need` is what the stream claims.
  Status Fill(IteratorContext* ctx, size_t need, bool greedy) {
    while (end_ - begin_ < need && !eof) {
      size_t have = end_ - begin_;
      size_t want = std::min(greedy ? need : std::max<size_t>(need, 16), std::max(2 * have, kReadStep));
      if (cap_ - begin_ < want || (greedy && end_ == cap_)) {
        if (cap_ < want) {
          size_t cap = std::max(want, 2 * cap_);
          std::unique_ptr<char[]> bigger(new char[cap]);
          memcpy(bigger.get(), buf_.get() + begin_, have);
          buf_ = std::move(bigger);
          cap_ = cap;
        } else {
          memmove(buf_.get(), buf_.get() + begin_, have);
        }
        begin_ = 0;
        end_ = have;
      }
      size_t room = want - have;
      if (greedy) {
        room = std::min(cap_ - end_, std::max(room, greedy_read_));
        greedy_read_ = std::min(2 * greedy_read_, kBufferBytes);
      }
      size_t got = 0;
      iovec part = {buf_.get() + end_, room};
      TF_RETURN_IF_ERROR(ReadSome(ctx, &part, 1, &got));
      if (got == 0) eof = true;
      end_ += got;
    }
    return absl::OkStatus();
  }

  // Reads `n` bytes past the (consumed) buffer straight into `dst` (fewer only at the end: `total`
  // says how many), and in the same reads up to `then` bytes that follow into the buffer (a large
  // TFRecord's CRC and the next header: one read per record instead of two).
  Status ReadExact(IteratorContext* ctx, char* dst, size_t n, size_t then, size_t* total) {
    *total = 0;
    begin_ = end_ = 0;
    then = std::min(then, cap_);
    while (*total < n && !eof) {
      iovec parts[2] = {{dst + *total, n - *total}, {buf_.get(), then}};
      size_t got = 0;
      TF_RETURN_IF_ERROR(ReadSome(ctx, parts, then > 0 ? 2 : 1, &got));
      if (got == 0) eof = true;
      size_t into = std::min(got, n - *total);
      *total += into;
      end_ = got - into;
    }
    offset += *total;
    return absl::OkStatus();
  }

 private:
  // Some bytes into `parts` (in order); 0 only at the end of the stream. Waits without holding the
  // stream's lock, so a newer iterator can close the FIFO meanwhile.
  Status ReadSome(IteratorContext* ctx, const iovec* parts, int count, size_t* got) {
    while (true) {
      {
        std::lock_guard<std::mutex> l(stream_->mu);
        if (stream_->superseded) {
          return absl::FailedPreconditionError(absl::StrCat(
              "PipeModeDataset of channel ", Quoted(channel), ": an iterator asked for chunk ", chunk,
              " out of turn, so two iterators of this dataset are being read at once. Each iteration "
              "reads the next FIFO and SageMaker opens it only after the last one is closed: iterate "
              "one at a time (a new iterator closes the one before it)"));
        }
        ssize_t r = count == 1 ? read(stream_->fd, parts[0].iov_base, parts[0].iov_len)
                               : readv(stream_->fd, parts, count);
        if (r > 0) {
          *got = r;
          bytes_read += r;
          return absl::OkStatus();
        }
        if (r == 0) {
          if (!fifo_) return *got = 0, absl::OkStatus();
          // A FIFO reads 0 both at its end and before its writer came: poll says which.
          pollfd p{stream_->fd, POLLIN, 0};
          if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) continue;
          if (p.revents & POLLHUP) return *got = 0, absl::OkStatus();
        } else if (errno == EINTR) {
          continue;
        } else if (errno != EAGAIN) {
          return absl::InternalError(absl::StrCat("reading ", path, ": ", strerror(errno)));
        }
      }
      if (Cancelled(ctx)) return absl::CancelledError("PipeModeDataset iterator cancelled");
      pollfd p{stream_->fd, POLLIN, 0};
      poll(&p, 1, kPollMs);
    }
  }

  std::shared_ptr<Stream> stream_;
  bool fifo_ = false;
  std::unique_ptr<char[]> buf_;
  size_t cap_ = 0, begin_ = 0, end_ = 0, greedy_read_ = kFirstRead;
};

}  // namespace sagemaker_dist_pipe
}  // namespace data
}  // namespace tensorflow

#endif  // SAGEMAKER_DIST_PIPE_SUPPORT_H_
