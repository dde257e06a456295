// PipeModeDataset's compiled reader: a tf.data source op over SageMaker Pipe-mode FIFOs.
//
// Built at first use against the TensorFlow installed where it runs (tensorflow/data/native_build.py), so it
// never outlives its TensorFlow as AWS's prebuilt op did. Each iterator is one iteration: it takes
// the channel's next epoch (<state_dir>/<channel> under flock, shared with the Python reader),
// waits for <pipe_dir>/<channel>_<epoch>, and frames TFRecord (both CRC32Cs, as TFRecordDataset
// checks them, with the CPU's CRC32C instructions, folded where it can: framing/native/record_core.h, the
// framing core the Python extensions share, as are its frame rules), RecordIO or text
// lines with large non-blocking reads into a 1 MiB buffer. Large TFRecords are read by the kernel
// straight into their output tensor, with the CRC and the next header in the same read. Errors name
// the channel, epoch and byte offset, in the Python reader's words (tests run the same checks on
// both). A length field is only the stream's claim: each is checked against max_record_bytes before
// any arithmetic on it or any allocation, and a large record's tensor grows as its bytes come.
// With a shuffle window (shuffle_records > 0) each window of records is read whole (each record into
// the tensor string of its place in the window's order, moved out later: no copy) and handed out in
// the order framing/native/shuffle_core.h draws from the stream's key and the epoch, the same order
// every other reader gives the stream.
#include "pipe_support.h"

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/op.h"

namespace tensorflow {
namespace data {
namespace sagemaker_dist_pipe {
namespace {

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
    std::vector<Node*> n(15);  // the op's inputs, in their order
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
    TF_RETURN_IF_ERROR(b->AddScalar(static_cast<int64_t>(c.max_record), &n[11]));
    TF_RETURN_IF_ERROR(b->AddScalar(c.shuffle_records, &n[12]));
    TF_RETURN_IF_ERROR(b->AddScalar(c.shuffle_bytes, &n[13]));
    TF_RETURN_IF_ERROR(b->AddScalar(static_cast<int64_t>(c.stream_key), &n[14]));
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
      in_.chunk = calls_;
      if (!in_.is_open()) TF_RETURN_IF_ERROR(Start(ctx));
      if (c_.batch <= 0) {
        tstring record;
        bool eof = false;
        Status s = Pull(ctx, &record, &eof);
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
        s = Pull(ctx, &v(n), &eof);
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
      if (!in_.is_open()) return;
      if (c_.benchmark) Report(false);
      if (skipped_)
        fprintf(stderr, "WARNING: channel %s, epoch %lld: skipped %lld corrupted record(s), read %lld\n",
                Quoted(c_.channel).c_str(), (long long)epoch_, (long long)skipped_, (long long)records_);
      in_.Close();
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
      in_.channel = c_.channel;
      in_.path = absl::StrCat(c_.pipe_dir, "/", c_.channel, "_", epoch_);
      Status s = in_.Open(ctx, std::move(stream), c_.pipe_dir, c_.timeout);
      if (!s.ok()) {
        int64_t ignored;
        UpdateEpoch(c_.state_dir, c_.channel, epoch_, &ignored);  // a retry waits for the same FIFO
        return s;
      }
      started_ = std::chrono::steady_clock::now();
      next_report_ = c_.interval;
      head_ = 0;
      head_count_ = 0;
      if (c_.shuffle_records > 0) {
        epoch_key_ = sd_epoch_key(c_.stream_key, static_cast<uint64_t>(epoch_ + EpochBase(c_.state_dir, c_.channel)));
        window_index_ = 0;
        window_records_ = 0;
        window_.clear();
        order_.clear();
        out_ = 0;
        window_error_ = absl::OkStatus();
        window_eof_ = false;
      }
      return absl::OkStatus();
    }

    // The next record: as it comes, or out of the shuffle window (shuffle_core.h): a window is read
    // whole, then handed out in its order, each record's string moved out (no copy). The records read
    // before an error come out first (in their window's order), then the error.
    Status Pull(IteratorContext* ctx, tstring* out, bool* eof) {
      if (c_.shuffle_records <= 0) return Next(ctx, out, eof);
      if (out_ == order_.size()) {
        if (!window_error_.ok() || window_eof_) {
          *eof = window_eof_;
          return window_error_;
        }
        FillWindow(ctx);
        if (order_.empty()) {
          *eof = window_eof_;
          return window_error_;
        }
        out_ = 0;
      }
      *out = std::move(window_[order_[out_++]]);
      return absl::OkStatus();
    }

    // Reads the next window, each record into the string of its place in the window's order (Q from
    // shuffle_core.h: place k takes the window's record Q[k]). Where the last window's records were of
    // about one size and short enough that a whole window of them fits its byte bound, every place's
    // string is allocated first, in the order the places go out, for the longest of them: so downstream
    // frees the strings in the order they were allocated, as it does unshuffled. Strings allocated as
    // records came and freed in the window's order cost 0.4 s/GB more at 1 KB (malloc's free lists).
    void FillWindow(IteratorContext* ctx) {
      const uint64_t size = static_cast<uint64_t>(c_.shuffle_records);
      scratch_.resize(size);
      place_.resize(size);
      window_.resize(size);
      sd_window_permutation(sd_window_key(epoch_key_, window_index_++), size, scratch_.data());
      for (uint64_t k = 0; k < size; ++k) {
        place_[scratch_[k]] = static_cast<int64_t>(k);
        if (reserve_ > 0) window_[k].reserve(reserve_);
      }
      const uint64_t bound = static_cast<uint64_t>(c_.shuffle_bytes), cap = sd_window_cap(bound);
      uint64_t count = 0, nbytes = 0, longest = 0, reserved = reserve_ * size;  // <= bound: see below
      // the window's count (shuffle_core.h), the first window's set by its first record
      uint64_t records = window_records_ ? window_records_ : size;
      while (count < records && nbytes < cap) {
        tstring& record = window_[place_[count]];
        if (reserved > 0 && count + SD_PLACE_AHEAD < size)  // strings allocated: fetch one a few records on
          sd_prefetch_place(window_[place_[count + SD_PLACE_AHEAD]].data(), reserve_);
        bool end = false;
        Status s = Next(ctx, &record, &end);
        if (!s.ok()) {
          window_error_ = s;
          break;
        }
        if (end) {
          window_eof_ = true;
          break;
        }
        nbytes += record.size();
        longest = std::max<uint64_t>(longest, record.size());
        if (++count == 1 && window_records_ == 0) records = sd_window_records(size, bound, 1, nbytes);
        if (reserved == 0) continue;
        // A string holds at most twice its record downstream; and the window, its records and the
        // places still reserved, at most its byte bound and a record: longer records than the last
        // window's free the places not taken yet.
        if (record.capacity() > 2 * record.size() + 16) record = tstring(record.data(), record.size());
        reserved -= reserve_;
        if (nbytes + reserved > bound) {
          for (uint64_t i = count; i < size; ++i) window_[place_[i]] = tstring();
          reserved = 0;
        }
      }
      window_records_ = sd_window_records(size, bound, count, nbytes);  // the next window's
      order_.clear();  // the places taken, in order: a window cut short keeps its records' order
      for (uint64_t k = 0; k < size; ++k)
        if (static_cast<uint64_t>(scratch_[k]) < count) order_.push_back(static_cast<int64_t>(k));
      // Only for records of about one size: a string keeps its capacity downstream (a .shuffle or
      // .prefetch buffer of them), so a window's longest record is reserved only where it is at most a
      // quarter over the mean. And only where a whole window of it fits the byte bound (no product to wrap).
      bool even = count > 0 && longest <= nbytes / count + nbytes / count / 4;
      reserve_ = even && longest <= bound / size ? longest : 0;
    }

    // A framing error, named (channel, epoch, byte offset): DataLossError, or `code` where AWS's reader
    // pins another (a stream that is not RecordIO is its InternalError).
    Status Error(const std::string& message, uint64_t offset,
                 absl::StatusCode code = absl::StatusCode::kDataLoss) const {
      return Status(code, absl::StrCat("channel ", Quoted(c_.channel), ", epoch ", epoch_, ", byte offset ",
                                       offset, ": ", c_.format, ": ", message));
    }

    Status Truncated(uint64_t nbytes, uint64_t frame, uint64_t at) const {
      std::string of = frame > nbytes ? absl::StrCat(" of a ", frame, "-byte frame") : "";
      return Error(absl::StrCat("stream ended inside a record: ", nbytes, " byte(s)", of,
                                " after the last complete record (the writer stopped mid-record; ",
                                records_, " complete record(s) were read)"),
                   at);
    }

    // A record of `length` bytes (or more, `at_least`) over max_record_bytes: framing/base.py's words.
    Status TooLong(uint64_t length, uint64_t at, bool at_least = false) const {
      return Error(absl::StrCat("a record of ", at_least ? "at least " : "", length,
                                " bytes is longer than max_record_bytes=", c_.max_record,
                                " (the stream is corrupt or not ", c_.format,
                                "; if the records are this long, raise max_record_bytes= or "
                                "$SAGEMAKER_DIST_MAX_RECORD_BYTES)"),
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
        if (!s.ok()) return s;
        if (*eof) {
          if (head_count_ < SD_HEAD_RECORDS) WriteHead();  // a stream of fewer records: its head is all
          return s;
        }
        if (skipped) continue;
        ++records_;
        if (head_count_ < SD_HEAD_RECORDS) {  // the stream's head (shuffle_core.h), noted for a resume
          head_ = sd_head_fold(head_, sd_crc32c(out->data(), out->size()), out->size());
          if (++head_count_ == SD_HEAD_RECORDS) WriteHead();
        }
        if (c_.interval > 0 && records_ >= next_report_) {  // with or without `benchmark`, as AWS's
          Report(true);
          next_report_ += c_.interval;
        }
        return absl::OkStatus();
      }
    }

    Status NextTFRecord(IteratorContext* ctx, tstring* out, bool* eof, bool* skipped) {
      TF_RETURN_IF_ERROR(in_.Fill(ctx, 12, !after_large_));
      size_t have = in_.size();
      if (have < 12) {
        if (have == 0) return *eof = true, absl::OkStatus();
        return Truncated(have, 0, in_.offset);
      }
      uint64_t n, at = in_.offset;
      int header = sd_tfrecord_header(Bytes(in_.data()), c_.max_record, &n, header_cache_);
      if (header == SD_FRAME_BAD_HEADER)
        return Error(absl::StrCat("length CRC mismatch (length field ", n,
                                  "); the stream is corrupt or not TFRecord (check record_format and "
                                  "RecordWrapperType)"),
                     at);
      // Before any arithmetic on n (n + 16 wraps near 2**64) and before anything is allocated for it.
      if (header == SD_FRAME_TOO_LONG) return TooLong(n, at);
      if (n >= kLargeRecord && have < n + 16) {  // the kernel's copy is the record
        after_large_ = true;
        in_.Consume(12);
        size_t buffered = std::min<size_t>(in_.size(), n);
        // The tensor grows as the bytes come (kReadStep, then doubling): n is only what the stream
        // claims. resize_uninitialized keeps the bytes, and a block this large moves by mremap.
        size_t size = std::min<uint64_t>(n, std::max(buffered, kReadStep));
        out->resize_uninitialized(size);
        memcpy(&(*out)[0], in_.data(), buffered);
        in_.Consume(buffered);
        size_t filled = buffered;
        while (filled < n) {
          if (filled == size) {
            size = std::min<uint64_t>(n, 2 * size);
            out->resize_uninitialized(size);
          }
          size_t got = 0;
          TF_RETURN_IF_ERROR(
              in_.ReadExact(ctx, &(*out)[0] + filled, size - filled, size == n ? 16 : 0, &got));
          bool short_read = got < size - filled;
          filled += got;
          if (short_read) return Truncated(12 + filled, n + 16, at);
        }
        TF_RETURN_IF_ERROR(in_.Fill(ctx, 4, false));
        if (in_.size() < 4) return Truncated(12 + n + (in_.size()), n + 16, at);
        uint32_t stored = U32(in_.data());
        in_.Consume(4);
        if (stored == MaskedCrc(out->data(), n)) {
          bad_in_a_row_ = 0;
          return absl::OkStatus();
        }
        *skipped = true;
        return Corrupted(absl::StrCat("data CRC mismatch in a ", n, "-byte record"), at);
      }
      after_large_ = false;
      TF_RETURN_IF_ERROR(in_.Fill(ctx, n + 16, true));
      have = in_.size();
      if (have < n + 16) return Truncated(have, n + 16, at);
      const char* data = in_.data() + 12;
      if (!sd_tfrecord_data_ok(Bytes(data), n)) {
        in_.Consume(n + 16);
        *skipped = true;
        return Corrupted(absl::StrCat("data CRC mismatch in a ", n, "-byte record"), at);
      }
      bad_in_a_row_ = 0;
      out->assign(data, n);
      in_.Consume(n + 16);
      return absl::OkStatus();
    }

    // SageMaker/MXNet RecordIO: magic, 29-bit length + 3-bit multipart flag, payload, padding to 4.
    Status NextRecordIO(IteratorContext* ctx, tstring* out, bool* eof) {
      uint64_t start = in_.offset;
      bool first = true;  // the first part is assigned: a string allocated beforehand keeps its bytes
      while (true) {
        TF_RETURN_IF_ERROR(in_.Fill(ctx, 8, true));
        size_t have = in_.size();
        if (have < 8) {
          if (have == 0 && first) return *eof = true, absl::OkStatus();
          return Truncated(in_.offset - start + have, 0, start);
        }
        uint32_t magic, flag, n;
        int header = sd_recordio_header(Bytes(in_.data()), first, &magic, &flag, &n);
        if (header == SD_FRAME_BAD_MAGIC) {
          char text[128];
          snprintf(text, sizeof(text), "bad magic number 0x%08X (expected 0x%08X)", magic, kRecordIOMagic);
          return Error(absl::StrCat(text, "; the stream is corrupt or not RecordIO (check record_format "
                                          "and RecordWrapperType)"),
                       in_.offset, absl::StatusCode::kInternal);
        }
        if (header == SD_FRAME_BAD_FLAG)
          return Error(absl::StrCat("multipart flag ", flag, " out of sequence (",
                                    first ? "a record must start with flag 0 or 1" : "expected 2 or 3", ")"),
                       in_.offset);
        uint64_t size = (first ? 0 : out->size()) + uint64_t{n};  // the parts so far: at least this long
        if (size > c_.max_record) return TooLong(size, start, !first || flag != 0);
        size_t padded = sd_recordio_frame(n);
        TF_RETURN_IF_ERROR(in_.Fill(ctx, padded, true));
        have = in_.size();
        if (have < padded) return Truncated(in_.offset - start + have, in_.offset - start + padded, start);
        if (first)
          out->assign(in_.data() + 8, n);
        else
          out->append(in_.data() + 8, n);
        in_.Consume(padded);
        first = false;
        if (sd_recordio_last(flag)) return absl::OkStatus();
      }
    }

    // One record per line; a trailing \r is dropped; the last line may lack its newline.
    Status NextLine(IteratorContext* ctx, tstring* out, bool* eof) {
      size_t scanned = 0;
      while (true) {
        const char* start = in_.data();
        size_t have = in_.size();
        const char* nl = static_cast<const char*>(memchr(start + scanned, '\n', have - scanned));
        if (nl != nullptr || (in_.eof && have > 0)) {
          size_t len = nl != nullptr ? nl - start : have;
          size_t line = sd_line_length(Bytes(start), len);
          if (line > c_.max_record) return TooLong(line, in_.offset);
          out->assign(start, line);
          in_.Consume(nl != nullptr ? len + 1 : len);
          return absl::OkStatus();
        }
        if (in_.eof) return *eof = true, absl::OkStatus();
        // No newline yet: the line so far, less a '\r' that a newline may follow, is its least length.
        size_t so_far = sd_line_length(Bytes(start), have);
        if (so_far > c_.max_record) return TooLong(so_far, in_.offset, true);
        scanned = have;
        TF_RETURN_IF_ERROR(in_.Fill(ctx, have + 1, true));
      }
    }

    // <state_dir>/.heads/<channel>_<epoch>: the stream's head, as epoch_reader/order.py's write_head writes it.
    void WriteHead() {
      head_count_ = SD_HEAD_RECORDS;  // noted once
      std::string dir = c_.state_dir + "/.heads";
      if (!MakeDirs(dir).ok()) return;
      std::string path = absl::StrCat(dir, "/", c_.channel, "_", epoch_);
      ::FILE* f = fopen((path + ".tmp").c_str(), "w");
      if (f == nullptr) return;
      fprintf(f, "%016llx", static_cast<unsigned long long>(head_));
      fclose(f);
      rename((path + ".tmp").c_str(), path.c_str());
    }

    // "<channel>_<epoch> Iterator records: N, ..." every benchmark_records_interval records (the words
    // AWS's reader prints), "<channel>_<epoch> epoch end: N records, ..." at the end with `benchmark`.
    void Report(bool progress) {
      double seconds = std::max(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(), 1e-9);
      printf("PipeModeDataset %s_%lld %s%lld%s, %lld bytes in %.3f s (%.0f records/s, %.1f MB/s)\n",
             c_.channel.c_str(), (long long)epoch_, progress ? "Iterator records: " : "epoch end: ",
             (long long)records_, progress ? "" : " records", (long long)in_.bytes_read, seconds,
             records_ / seconds, in_.bytes_read / seconds / 1e6);
      fflush(stdout);
    }

    const Config& c_;
    std::mutex mu_;
    FifoBuffer in_;
    Status pending_ = absl::OkStatus();
    bool done_ = false, after_large_ = false;
    uint64_t header_cache_[2] = {0, 0};  // the last TFRecord length and its masked CRC (record_core.h)
    int64_t epoch_ = 0, calls_ = 0, records_ = 0, skipped_ = 0, bad_in_a_row_ = 0, next_report_ = 0;
    std::chrono::steady_clock::time_point started_;
    // the shuffle window: its records as they came, the order they go out in, how many went out
    uint64_t epoch_key_ = 0, window_index_ = 0, window_records_ = 0, head_ = 0;  // records: the next window's
    int head_count_ = 0;
    std::vector<tstring> window_;  // by place
    std::vector<int64_t> order_, scratch_, place_;  // places handed out, Q, each record's place
    uint64_t reserve_ = 0;  // each place's string's first capacity (0: as its record comes); kept across epochs
    size_t out_ = 0;
    Status window_error_ = absl::OkStatus();
    bool window_eof_ = false;
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
  explicit PipeDatasetOp(OpKernelConstruction* ctx) : DatasetOpKernel(ctx) { sd_crc32c_init(); }
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
    int64_t max_record = 0, stream_key = 0;
    OP_REQUIRES_OK(ctx, Scalar(ctx, "max_record_bytes", &max_record));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "shuffle_records", &c.shuffle_records));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "shuffle_bytes", &c.shuffle_bytes));
    OP_REQUIRES_OK(ctx, Scalar(ctx, "stream_key", &stream_key));
    c.stream_key = static_cast<uint64_t>(stream_key);
    OP_REQUIRES(ctx, c.shuffle_records >= 0 && c.shuffle_records < (int64_t{1} << 24) &&
                         (c.shuffle_records == 0 || c.shuffle_bytes >= 1),
                absl::InvalidArgumentError(absl::StrCat("shuffle window of ", c.shuffle_records, " records and ",
                                                        c.shuffle_bytes,
                                                        " bytes: need 0 <= records < 2**24, and bytes >= 1")));
    OP_REQUIRES(ctx, max_record >= 1 && static_cast<uint64_t>(max_record) <= kMaxRecordCeiling,
                absl::InvalidArgumentError(absl::StrCat("max_record_bytes ", max_record,
                                                        " is not from 1 to 2**62")));
    c.max_record = static_cast<uint64_t>(max_record);
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
    .Input("max_record_bytes: int64")
    .Input("shuffle_records: int64")
    .Input("shuffle_bytes: int64")
    .Input("stream_key: int64")
    .Output("handle: variant")
    .SetDoNotOptimize()  // a source dataset: no constant folding
    .SetShapeFn(shape_inference::ScalarShape);

REGISTER_KERNEL_BUILDER(Name("SagemakerDistPipeDataset").Device(DEVICE_CPU), PipeDatasetOp);

}  // namespace
}  // namespace sagemaker_dist_pipe
}  // namespace data
}  // namespace tensorflow
