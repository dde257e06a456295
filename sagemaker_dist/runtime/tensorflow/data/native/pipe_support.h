// What the compiled Pipe-mode reader (pipe_dataset_op.cc) stands on: the framing core (CRC32C and the
// frame rules, framing/native/record_core.h, shared with the Python extensions), the epoch counter
// shared with the Python reader (epoch_reader/epochs.py), and the FIFO read with non-blocking large reads.
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

#include "absl/strings/str_cat.h"
#include "record_core.h"
#include "shuffle_core.h"
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
constexpr uint64_t kMaxRecordCeiling = SD_MAX_RECORD_CEILING;
constexpr uint32_t kRecordIOMagic = SD_RECORDIO_MAGIC;
constexpr int kPollMs = 50;  // how often a blocked read looks for cancellation or a newer iterator

// ---- CRC32C and the frame rules: the framing core the Python extensions share (-I framing/native) ----
inline uint32_t MaskedCrc(const char* p, size_t n) { return sd_masked_crc32c(p, n); }

inline const unsigned char* Bytes(const char* p) { return reinterpret_cast<const unsigned char*>(p); }

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

// ---- the epoch counter and the FIFO: the same files and words as epoch_reader/epochs.py and fifo.py ----
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
  // the shuffle window (framing/native/shuffle_core.h): 0 records is none; the stream's key
  int64_t shuffle_records = 0, shuffle_bytes = 0;
  uint64_t stream_key = 0;
};

// The epoch a FIFO's records are shuffled as: its number plus <state_dir>/.epoch-base/<channel> (0 where
// it is absent), which a resumed job writes (epoch_reader/order.py: set_epoch_base).
inline int64_t EpochBase(const std::string& state_dir, const std::string& channel) {
  std::string path = state_dir + "/.epoch-base/" + channel;
  ::FILE* f = fopen(path.c_str(), "r");
  if (f == nullptr) return 0;
  long long value = 0;
  if (fscanf(f, "%lld", &value) != 1) value = 0;
  fclose(f);
  return static_cast<int64_t>(value);
}

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
