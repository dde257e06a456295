// PipeModeDataset's compiled reader: a tf.data source op over SageMaker Pipe-mode FIFOs.
//
// Built at first use against the TensorFlow installed where it runs (pipe/native_build.py), so it
// never outlives its TensorFlow as AWS's prebuilt op did. Each iterator is one iteration: it takes
// the channel's next epoch (<state_dir>/<channel> under flock, shared with the Python reader),
// waits for <pipe_dir>/<channel>_<epoch>, and frames TFRecord (both CRC32Cs, in hardware where the
// CPU has SSE4.2), RecordIO or text lines with large non-blocking reads into a 1 MiB buffer. Large
// TFRecords are read by the kernel straight into their output tensor. Errors name the channel,
// epoch and byte offset, in the Python reader's words (tests run the same checks on both).
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
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
namespace {

using Status = ::absl::Status;

constexpr size_t kBufferBytes = 1 << 20;     // read size, and the pipe buffer asked for
constexpr uint64_t kLargeRecord = 32 << 10;  // TFRecords this large are read into their tensor
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
const CrcTable& Table() {
  static const CrcTable* table = new CrcTable();
  return *table;
}

uint32_t Crc32cSoftware(const char* p, size_t n) {
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
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const char* p, size_t n) {
  uint64_t c = 0xFFFFFFFFu;
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
const bool kHardwareCrc = __builtin_cpu_supports("sse4.2");
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

std::string Quoted(const std::string& s) { return absl::StrCat("'", s, "'"); }

// ---- the epoch counter and the FIFO: the same files and words as pipe/epochs.py and fifo.py ----
Status MakeDirs(const std::string& path) {
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
Status UpdateEpoch(const std::string& state_dir, const std::string& channel, int64_t undo,
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

std::string MissingMessage(const std::string& dir, const std::string& path, float timeout) {
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

bool Cancelled(IteratorContext* ctx) {
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
std::mutex live_mu;
std::map<int64_t, std::weak_ptr<Stream>>* live = new std::map<int64_t, std::weak_ptr<Stream>>();

struct Config {
  std::string channel, format, state_dir, pipe_dir;
  float timeout;
  int64_t max_skip, batch, interval, id;
  bool drop_remainder, benchmark;
};

class PipeDataset : public DatasetBase {
 public:
  PipeDataset(OpKernelContext* ctx, Config config)
      : DatasetBase(DatasetContext(ctx)), config_(std::move(config)) {
    if (config_.batch > 0)
      shapes_.push_back(PartialTensorShape({config_.drop_remainder ? config_.batch : -1}));
    else
      shapes_.push_back(PartialTensorShape({}));
  }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(const std::string& prefix) const override {
    return std::make_unique<Iterator>(Iterator::Params{this, absl::StrCat(prefix, "::PipeMode")});
  }
  const DataTypeVector& output_dtypes() const override {
    static DataTypeVector* dtypes = new DataTypeVector({DT_STRING});
    return *dtypes;
  }
  const std::vector<PartialTensorShape>& output_shapes() const override { return shapes_; }
  std::string DebugString() const override { return "PipeModeDatasetOp(" + config_.channel + ")"; }
  Status InputDatasets(std::vector<const DatasetBase*>* inputs) const override {
    inputs->clear();
    return absl::OkStatus();
  }
  Status CheckExternalState() const override { return absl::OkStatus(); }

 protected:
  // So tf.data can rewrite (optimise) and serialise pipelines that start here.
  Status AsGraphDefInternal(SerializationContext* ctx, DatasetGraphDefBuilder* b,
                            Node** output) const override {
    const Config& c = config_;
    std::vector<Node*> n(12);
    TF_RETURN_IF_ERROR(b->AddScalar(tstring(c.channel), &n[0]));
    TF_RETURN_IF_ERROR(b->AddScalar(tstring(c.format), &n[1]));
    TF_RETURN_IF_ERROR(b->AddScalar(tstring(c.state_dir), &n[2]));
    TF_RETURN_IF_ERROR(b->AddScalar(tstring(c.pipe_dir), &n[3]));
    TF_RETURN_IF_ERROR(b->AddScalar(c.timeout, &n[4]));
    TF_RETURN_IF_ERROR(b->AddScalar(c.max_skip, &n[5]));
    TF_RETURN_IF_ERROR(b->AddScalar(c.batch, &n[6]));
    TF_RETURN_IF_ERROR(b->AddScalar(c.drop_remainder, &n[7]));
    TF_RETURN_IF_ERROR(b->AddScalar(c.benchmark, &n[8]));
    TF_RETURN_IF_ERROR(b->AddScalar(c.interval, &n[9]));
    TF_RETURN_IF_ERROR(b->AddScalar(c.id, &n[10]));
    n.pop_back();
    return b->AddDataset(this, n, output);
  }

 private:
  class Iterator : public DatasetIterator<PipeDataset> {
   public:
    explicit Iterator(const Params& params)
        : DatasetIterator<PipeDataset>(params), c_(params.dataset->config_) {}

    Status GetNextInternal(IteratorContext* ctx, std::vector<Tensor>* out, bool* end) override {
      std::lock_guard<std::mutex> l(mu_);
      ++calls_;
      *end = false;
      if (!pending_.ok()) return Finish(pending_, end);
      if (done_) {
        *end = true;
        return absl::OkStatus();
      }
      if (!stream_) TF_RETURN_IF_ERROR(Start(ctx));
      if (c_.batch <= 0) {
        tstring record;
        bool eof = false;
        Status s = Next(ctx, &record, &eof);
        if (!s.ok() || eof) return Finish(s, end);
        Tensor t(DT_STRING, TensorShape({}));
        t.scalar<tstring>()() = std::move(record);
        out->push_back(std::move(t));
        return absl::OkStatus();
      }
      Tensor batch(DT_STRING, TensorShape({c_.batch}));
      auto v = batch.vec<tstring>();
      int64_t n = 0;
      Status s = absl::OkStatus();
      bool eof = false;
      while (n < c_.batch) {
        s = Next(ctx, &v(n), &eof);
        if (!s.ok() || eof) break;
        ++n;
      }
      if (n == c_.batch) {
        out->push_back(std::move(batch));
        return absl::OkStatus();
      }
      if (n == 0 || c_.drop_remainder) return Finish(s, end);
      if (s.ok()) {
        done_ = true;
        Close();
      } else {
        pending_ = s;  // the records before an error come first
      }
      Tensor part(DT_STRING, TensorShape({n}));
      auto p = part.vec<tstring>();
      for (int64_t i = 0; i < n; ++i) p(i) = std::move(v(i));
      out->push_back(std::move(part));
      return absl::OkStatus();
    }

   protected:
    std::shared_ptr<model::Node> CreateNode(IteratorContext* ctx,
                                                        model::Node::Args args) const override {
      return model::MakeSourceNode(std::move(args));
    }
    Status SaveInternal(SerializationContext*, IteratorStateWriter*) override {
      return absl::UnimplementedError("PipeModeDataset reads a FIFO: its position cannot be saved");
    }
    Status RestoreInternal(IteratorContext*, IteratorStateReader*) override {
      return absl::UnimplementedError("PipeModeDataset reads a FIFO: its position cannot be restored");
    }

   private:
    // The end of the iteration (ok) or its error; the FIFO is closed either way.
    Status Finish(Status s, bool* end) {
      done_ = true;
      Close();
      if (s.ok()) *end = true;
      return s;
    }

    void Close() {
      if (!stream_) return;
      if (c_.benchmark) Report("epoch end");
      if (skipped_)
        fprintf(stderr, "WARNING: channel %s, epoch %lld: skipped %lld corrupted record(s), read %lld\n",
                Quoted(c_.channel).c_str(), (long long)epoch_, (long long)skipped_, (long long)records_);
      std::lock_guard<std::mutex> l(stream_->mu);
      if (stream_->fd >= 0) close(stream_->fd);
      stream_->fd = -1;
    }

    // A new iteration: close the one before it, take the next epoch, wait for its FIFO, open it.
    Status Start(IteratorContext* ctx) {
      auto stream = std::make_shared<Stream>();
      {
        std::lock_guard<std::mutex> l(live_mu);
        auto old = (*live)[c_.id].lock();
        if (old) old->Supersede();
        (*live)[c_.id] = stream;
      }
      TF_RETURN_IF_ERROR(UpdateEpoch(c_.state_dir, c_.channel, -1, &epoch_));
      path_ = absl::StrCat(c_.pipe_dir, "/", c_.channel, "_", epoch_);
      Status s = WaitForFifo(ctx);
      int64_t ignored;
      if (!s.ok()) {
        UpdateEpoch(c_.state_dir, c_.channel, epoch_, &ignored);  // a retry waits for the same FIFO
        return s;
      }
      int fd = open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path_, ": ", strerror(errno)));
      struct stat st;
      fifo_ = fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
      if (fifo_) fcntl(fd, F_SETPIPE_SZ, static_cast<int>(kBufferBytes));  // best effort
      stream->fd = fd;
      stream_ = stream;
      buf_.reset(new char[kBufferBytes]);
      cap_ = kBufferBytes;
      started_ = std::chrono::steady_clock::now();
      next_report_ = c_.interval;
      return absl::OkStatus();
    }

    Status WaitForFifo(IteratorContext* ctx) {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(c_.timeout);
      while (true) {
        struct stat st;
        if (stat(path_.c_str(), &st) == 0) {
          if (S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode)) return absl::OkStatus();
          return absl::FailedPreconditionError(path_ + " exists but is not a FIFO or a file; remove it");
        }
        if (std::chrono::steady_clock::now() >= deadline)
          return absl::DeadlineExceededError(MissingMessage(c_.pipe_dir, path_, c_.timeout));
        if (Cancelled(ctx)) return absl::CancelledError("PipeModeDataset iterator cancelled");
        std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
      }
    }

    // Up to `n` bytes into `dst`; 0 only at the end of the stream. Waits without holding the
    // stream's lock, so a newer iterator can close the FIFO meanwhile.
    Status ReadSome(IteratorContext* ctx, char* dst, size_t n, size_t* got) {
      while (true) {
        {
          std::lock_guard<std::mutex> l(stream_->mu);
          if (stream_->superseded) {
            return absl::FailedPreconditionError(absl::StrCat(
                "PipeModeDataset of channel ", Quoted(c_.channel), ": an iterator asked for chunk ", calls_,
                " out of turn, so two iterators of this dataset are being read at once. Each iteration "
                "reads the next FIFO and SageMaker opens it only after the last one is closed: iterate "
                "one at a time (a new iterator closes the one before it)"));
          }
          ssize_t r = read(stream_->fd, dst, n);
          if (r > 0) {
            *got = r;
            bytes_read_ += r;
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
            return absl::InternalError(absl::StrCat("reading ", path_, ": ", strerror(errno)));
          }
        }
        if (Cancelled(ctx)) return absl::CancelledError("PipeModeDataset iterator cancelled");
        pollfd p{stream_->fd, POLLIN, 0};
        poll(&p, 1, kPollMs);
      }
    }

    // At least `need` bytes buffered (fewer only at the end). Greedy reads fill the buffer;
    // otherwise each read asks for no more than `need` (large records: their data is read apart).
    Status Fill(IteratorContext* ctx, size_t need, bool greedy) {
      while (end_ - begin_ < need && !eof_) {
        size_t have = end_ - begin_;
        if (cap_ - begin_ < need || (greedy && end_ == cap_)) {
          if (cap_ < need) {
            size_t cap = std::max(need, 2 * cap_);
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
        size_t room = greedy ? cap_ - end_ : need - have;
        size_t got = 0;
        TF_RETURN_IF_ERROR(ReadSome(ctx, buf_.get() + end_, room, &got));
        if (got == 0) eof_ = true;
        end_ += got;
      }
      return absl::OkStatus();
    }

    // Reads exactly `n` bytes into `dst` (fewer only at the end); returns how many.
    Status ReadExact(IteratorContext* ctx, char* dst, size_t n, size_t* total) {
      *total = 0;
      while (*total < n && !eof_) {
        size_t got = 0;
        TF_RETURN_IF_ERROR(ReadSome(ctx, dst + *total, n - *total, &got));
        if (got == 0) eof_ = true;
        *total += got;
      }
      return absl::OkStatus();
    }

    void Consume(size_t n) {
      begin_ += n;
      offset_ += n;
    }

    Status Error(const std::string& message, uint64_t offset) const {
      return absl::DataLossError(absl::StrCat("channel ", Quoted(c_.channel), ", epoch ", epoch_,
                                              ", byte offset ", offset, ": ", c_.format, ": ", message));
    }

    Status Truncated(uint64_t nbytes, uint64_t frame, uint64_t at) const {
      std::string of = frame > nbytes ? absl::StrCat(" of a ", frame, "-byte frame") : "";
      return Error(absl::StrCat("stream ended inside a record: ", nbytes, " byte(s)", of,
                                " after the last complete record (the writer stopped mid-record; ",
                                records_, " complete record(s) were read)"),
                   at);
    }

    // A corrupted record: skipped if max_corrupted_records_to_skip allows (as AWS's reader does).
    Status Corrupted(const std::string& message, uint64_t at) {
      ++bad_in_a_row_;
      if (bad_in_a_row_ > c_.max_skip) {
        std::string hint =
            c_.max_skip ? absl::StrCat(" (", bad_in_a_row_, " corrupted records in a row, over ",
                                       "max_corrupted_records_to_skip=", c_.max_skip, ")")
                        : "; pass max_corrupted_records_to_skip=N to skip up to N corrupted records in a row";
        return Error(message + hint, at);
      }
      ++skipped_;
      fprintf(stderr,
              "WARNING: channel %s, epoch %lld, byte offset %llu: skipped corrupted %s record (%s); "
              "%lld skipped so far this epoch\n",
              Quoted(c_.channel).c_str(), (long long)epoch_, (unsigned long long)at, c_.format.c_str(),
              message.c_str(), (long long)skipped_);
      return absl::OkStatus();
    }

    Status Next(IteratorContext* ctx, tstring* out, bool* eof) {
      while (true) {
        bool skipped = false;
        Status s = c_.format == "TFRecord"   ? NextTFRecord(ctx, out, eof, &skipped)
                   : c_.format == "RecordIO" ? NextRecordIO(ctx, out, eof)
                                             : NextLine(ctx, out, eof);
        if (!s.ok() || *eof) return s;
        if (skipped) continue;
        ++records_;
        if (c_.benchmark && c_.interval > 0 && records_ >= next_report_) {
          Report("progress");
          next_report_ += c_.interval;
        }
        return absl::OkStatus();
      }
    }

    Status NextTFRecord(IteratorContext* ctx, tstring* out, bool* eof, bool* skipped) {
      TF_RETURN_IF_ERROR(Fill(ctx, 12, !after_large_));
      size_t have = end_ - begin_;
      if (have < 12) {
        if (have == 0) return *eof = true, absl::OkStatus();
        return Truncated(have, 0, offset_);
      }
      const char* h = buf_.get() + begin_;
      uint64_t n = U64(h);
      if (U32(h + 8) != MaskedCrc(h, 8))
        return Error(absl::StrCat("length CRC mismatch (length field ", n,
                                  "); the stream is corrupt or not TFRecord (check record_format and "
                                  "RecordWrapperType)"),
                     offset_);
      uint64_t at = offset_;
      if (n >= kLargeRecord && have < n + 16) {  // the kernel's copy is the record
        after_large_ = true;
        Consume(12);
        size_t buffered = std::min<size_t>(end_ - begin_, n);
        out->resize_uninitialized(n);
        char* data = &(*out)[0];
        memcpy(data, buf_.get() + begin_, buffered);
        Consume(buffered);
        size_t got = 0;
        TF_RETURN_IF_ERROR(ReadExact(ctx, data + buffered, n - buffered, &got));
        offset_ += got;
        if (buffered + got < n) return Truncated(12 + buffered + got, n + 16, at);
        TF_RETURN_IF_ERROR(Fill(ctx, 4, false));
        if (end_ - begin_ < 4) return Truncated(12 + n + (end_ - begin_), n + 16, at);
        uint32_t stored = U32(buf_.get() + begin_);
        Consume(4);
        if (stored == MaskedCrc(data, n)) {
          bad_in_a_row_ = 0;
          return absl::OkStatus();
        }
        *skipped = true;
        return Corrupted(absl::StrCat("data CRC mismatch in a ", n, "-byte record"), at);
      }
      after_large_ = false;
      TF_RETURN_IF_ERROR(Fill(ctx, n + 16, true));
      have = end_ - begin_;
      if (have < n + 16) return Truncated(have, n + 16, at);
      const char* data = buf_.get() + begin_ + 12;
      if (U32(data + n) != MaskedCrc(data, n)) {
        Consume(n + 16);
        *skipped = true;
        return Corrupted(absl::StrCat("data CRC mismatch in a ", n, "-byte record"), at);
      }
      bad_in_a_row_ = 0;
      out->assign(data, n);
      Consume(n + 16);
      return absl::OkStatus();
    }

    // SageMaker/MXNet RecordIO: magic, 29-bit length + 3-bit multipart flag, payload, padding to 4.
    Status NextRecordIO(IteratorContext* ctx, tstring* out, bool* eof) {
      uint64_t start = offset_;
      bool first = true;
      out->clear();
      while (true) {
        TF_RETURN_IF_ERROR(Fill(ctx, 8, true));
        size_t have = end_ - begin_;
        if (have < 8) {
          if (have == 0 && first) return *eof = true, absl::OkStatus();
          return Truncated(offset_ - start + have, 0, start);
        }
        const char* h = buf_.get() + begin_;
        uint32_t magic = U32(h), word = U32(h + 4);
        if (magic != kRecordIOMagic) {
          char text[128];
          snprintf(text, sizeof(text), "bad magic number 0x%08X (expected 0x%08X)", magic, kRecordIOMagic);
          return Error(absl::StrCat(text, "; the stream is corrupt or not RecordIO (check record_format "
                                          "and RecordWrapperType)"),
                       offset_);
        }
        uint32_t flag = word >> 29, n = word & ((1u << 29) - 1);
        if (flag > 3 || (flag <= 1) != first)
          return Error(absl::StrCat("multipart flag ", flag, " out of sequence (",
                                    first ? "a record must start with flag 0 or 1" : "expected 2 or 3", ")"),
                       offset_);
        size_t padded = 8 + n + ((4 - n % 4) % 4);
        TF_RETURN_IF_ERROR(Fill(ctx, padded, true));
        have = end_ - begin_;
        if (have < padded) return Truncated(offset_ - start + have, offset_ - start + padded, start);
        out->append(buf_.get() + begin_ + 8, n);
        Consume(padded);
        first = false;
        if (flag == 0 || flag == 3) return absl::OkStatus();
      }
    }

    // One record per line; a trailing \r is dropped; the last line may lack its newline.
    Status NextLine(IteratorContext* ctx, tstring* out, bool* eof) {
      size_t scanned = 0;
      while (true) {
        const char* start = buf_.get() + begin_;
        size_t have = end_ - begin_;
        const char* nl = static_cast<const char*>(memchr(start + scanned, '\n', have - scanned));
        if (nl != nullptr || (eof_ && have > 0)) {
          size_t len = nl != nullptr ? nl - start : have;
          size_t line = len;
          if (line > 0 && start[line - 1] == '\r') --line;
          out->assign(start, line);
          Consume(nl != nullptr ? len + 1 : len);
          return absl::OkStatus();
        }
        if (eof_) return *eof = true, absl::OkStatus();
        scanned = have;
        TF_RETURN_IF_ERROR(Fill(ctx, have + 1, true));
      }
    }

    void Report(const char* what) {
      double seconds = std::max(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(), 1e-9);
      printf("PipeModeDataset %s_%lld %s: %lld records, %lld bytes in %.3f s (%.0f records/s, %.1f MB/s)\n",
             c_.channel.c_str(), (long long)epoch_, what, (long long)records_, (long long)bytes_read_,
             seconds, records_ / seconds, bytes_read_ / seconds / 1e6);
      fflush(stdout);
    }

    const Config& c_;
    std::mutex mu_;
    std::shared_ptr<Stream> stream_;
    std::string path_;
    Status pending_ = absl::OkStatus();
    bool done_ = false, fifo_ = false, eof_ = false, after_large_ = false;
    int64_t epoch_ = 0, calls_ = 0, records_ = 0, skipped_ = 0, bad_in_a_row_ = 0, bytes_read_ = 0;
    int64_t next_report_ = 0;
    std::unique_ptr<char[]> buf_;
    size_t cap_ = 0, begin_ = 0, end_ = 0;
    uint64_t offset_ = 0;  // stream offset of buf_[begin_]
    std::chrono::steady_clock::time_point started_;
  };

  const Config config_;
  std::vector<PartialTensorShape> shapes_;
};

template <typename T>
Status Scalar(OpKernelContext* ctx, const char* name, T* out) {
  const Tensor* t;
  TF_RETURN_IF_ERROR(ctx->input(name, &t));
  *out = t->scalar<T>()();
  return absl::OkStatus();
}

class PipeDatasetOp : public DatasetOpKernel {
 public:
  explicit PipeDatasetOp(OpKernelConstruction* ctx) : DatasetOpKernel(ctx) {}
  void MakeDataset(OpKernelContext* ctx, DatasetBase** output) override {
    Config c;
    tstring channel, format, state_dir, pipe_dir;
    OP_REQUIRES_OK(ctx, Scalar(ctx, "channel", &channel));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "record_format", &format));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "state_dir", &state_dir));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "pipe_dir", &pipe_dir));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "fifo_timeout", &c.timeout));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "max_corrupted_records_to_skip", &c.max_skip));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "batch_size", &c.batch));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "drop_remainder", &c.drop_remainder));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "benchmark", &c.benchmark));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "benchmark_records_interval", &c.interval));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "dataset_id", &c.id));
    c.channel = std::string(channel);
    c.format = std::string(format);
    c.state_dir = std::string(state_dir);
    c.pipe_dir = std::string(pipe_dir);
    OP_REQUIRES(ctx, c.format == "TFRecord" || c.format == "RecordIO" || c.format == "TextLine",
                absl::InvalidArgumentError("record_format " + c.format + " is not one of TFRecord, RecordIO, TextLine"));
    *output = new PipeDataset(ctx, std::move(c));
  }
};

REGISTER_OP("SagemakerDistPipeDataset")
    .Input("channel: string")
    .Input("record_format: string")
    .Input("state_dir: string")
    .Input("pipe_dir: string")
    .Input("fifo_timeout: float")
    .Input("max_corrupted_records_to_skip: int64")
    .Input("batch_size: int64")
    .Input("drop_remainder: bool")
    .Input("benchmark: bool")
    .Input("benchmark_records_interval: int64")
    .Input("dataset_id: int64")
    .Output("handle: variant")
    .SetDoNotOptimize()  // a source dataset: no constant folding
    .SetShapeFn(shape_inference::ScalarShape);

REGISTER_KERNEL_BUILDER(Name("SagemakerDistPipeDataset").Device(DEVICE_CPU), PipeDatasetOp);

}  // namespace
}  // namespace sagemaker_dist_pipe
}  // namespace data
}  // namespace tensorflow
