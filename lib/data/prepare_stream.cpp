// Chunked, threaded tokenizing (data/prepare_stream.h). The main thread reads and cuts
// chunks and hands results on in order; workers parse and tokenize. Each chunk starts
// at a record boundary, so tokenizing it alone gives what one pass over the file gives.
#include "data/prepare_stream.h"

#include "core/check.h"
#include "core/input_file.h"
#include "data/llamafactory.h"
#include "data/pairwise.h"

#include <algorithm>
#include <filesystem>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

namespace dtrain::data {

namespace fs = std::filesystem;

namespace {

// A span of whole records. Line-delimited input: bytes are whole lines, the first being
// line first_line. A .json array dataset: `records` gives each element's place in bytes
// and the line it starts on.
struct Record {
  size_t offset, length, line;
};
struct Chunk {
  std::string bytes;
  size_t first_line = 1;    // 1-based line number of bytes[0]
  size_t first_record = 0;  // LLaMA-Factory: the index of the chunk's first record in its dataset
  std::vector<Record> records;
  size_t input_end = 0;
};

bool blank(std::string_view line) { return line.find_first_not_of(" \t") == std::string_view::npos; }
// LLaMA-Factory's .jsonl reader skips lines of white space, '\r' included.
bool blank_lf(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// Calls fn(line, line_no) for each line of `text` as std::getline splits it (no
// trailing empty line after a final '\n'), with one trailing '\r' removed.
template <class F>
void for_each_line(std::string_view text, size_t first_line, F&& fn) {
  size_t pos = 0, line_no = first_line;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? text.size() : nl;
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    fn(line, line_no++);
    pos = end + 1;
  }
}

// ---------------------------------------------------------------------------
// Reading: chunks of whole records

class ChunkReader {
 public:
  // paragraphs: cut only after a blank line (TEXT documents span lines). count_records:
  // set each chunk's first_record (LLaMA-Factory .jsonl, whose errors give the index).
  ChunkReader(const std::string& path, const char* what, size_t chunk_bytes, bool paragraphs,
              bool count_records = false)
      : path_(path), what_(what), chunk_bytes_(std::max<size_t>(chunk_bytes, 1)), paragraphs_(paragraphs),
        count_records_(count_records) {
    fd_ = input_file_open(path, what).release();
  }
  ~ChunkReader() { ::close(fd_); }
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  size_t records() const { return records_; }  // with count_records: those in the chunks so far

  // The next chunk: at least chunk_bytes read (unless the file ends), cut after the last
  // record boundary in it; false at the end of the file.
  bool next(Chunk& out) {
    for (;;) {
      if (eof_ || pending_.size() >= chunk_bytes_) {
        const size_t n = eof_ ? pending_.size() : cut_;
        if (n > 0) {
          out.bytes.assign(pending_, 0, n);
          pending_.erase(0, n);
          scan_ -= std::min(scan_, n);
          cut_ = 0;
          out.first_line = line_;
          line_ += static_cast<size_t>(std::count(out.bytes.begin(), out.bytes.end(), '\n'));
          out.first_record = records_;
          if (count_records_)
            for_each_line(out.bytes, 0, [&](std::string_view l, size_t) { records_ += blank_lf(l) ? 0 : 1; });
          consumed_ += n;
          out.input_end = consumed_;
          return true;
        }
        if (eof_) return false;
      }
      // One record longer than the chunk (or no boundary yet): read more.
      const size_t old = pending_.size();
      pending_.resize(old + chunk_bytes_);
      ssize_t r;
      do {
        r = ::read(fd_, pending_.data() + old, chunk_bytes_);
      } while (r < 0 && errno == EINTR);
      if (r < 0) {
        const int e = errno;
        DT_THROW(IoError, "error reading {} '{}' after line {}: {}", what_, path_, line_, std::strerror(e));
      }
      pending_.resize(old + static_cast<size_t>(r));
      if (r == 0) eof_ = true;
      scan();
    }
  }

 private:
  // Moves cut_ past each newly complete line that ends a record.
  void scan() {
    for (;;) {
      const size_t nl = pending_.find('\n', scan_);
      if (nl == std::string::npos) return;
      std::string_view line(pending_.data() + scan_, nl - scan_);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (!paragraphs_ || blank(line)) cut_ = nl + 1;
      scan_ = nl + 1;
    }
  }

  std::string path_;
  const char* what_;
  size_t chunk_bytes_;
  bool paragraphs_, count_records_;
  size_t records_ = 0;
  int fd_ = -1;
  size_t consumed_ = 0;
  std::string pending_;
  size_t scan_ = 0, cut_ = 0, line_ = 1;
  bool eof_ = false;
};

// ---------------------------------------------------------------------------
// Tokenizing one chunk

struct Context {
  std::string input;
  DataFormat format;
  const Tokenizer* tokenizer;
  const DataPrepareOptions* options;
  SftTemplate tmpl;
  SftFormat sft_format = SftFormat::AUTO;
  const LlamaFactoryEntry* entry = nullptr;  // set: records are this LLaMA-Factory dataset's
};

void piece_add(TokenPiece& p, const std::vector<int32_t>& ids, const std::vector<uint8_t>* mask) {
  if (ids.empty()) return;
  p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
  if (mask) p.mask.insert(p.mask.end(), mask->begin(), mask->end());
  p.doc_tokens.push_back(ids.size());
}

void text_document(TokenPiece& p, std::string_view doc, const Context& c) {
  const Tokenizer& tok = *c.tokenizer;
  const size_t start = p.tokens.size();
  if (c.options->add_bos && tok.bos_id() >= 0) p.tokens.push_back(tok.bos_id());
  const std::vector<int32_t> body = tok.encode_ordinary(doc);
  p.tokens.insert(p.tokens.end(), body.begin(), body.end());
  if (tok.eos_id() >= 0) p.tokens.push_back(tok.eos_id());
  if (p.tokens.size() > start) p.doc_tokens.push_back(p.tokens.size() - start);
}

// Tokenizes `chunk` into `p`, whose buffers (a recycled piece's) keep their capacity:
// fresh multi-MB vectors per chunk would cost a page fault per 4 KB and the copies of
// their growth.
void chunk_tokenize(const Chunk& chunk, const Context& c, TokenPiece& p) {
  p.tokens.clear();
  p.mask.clear();
  p.doc_tokens.clear();
  p.input_end = chunk.input_end;
  if (c.format == DataFormat::TEXT) {
    // Documents: single non-blank lines, or runs of non-blank lines joined by '\n'.
    std::string cur;
    bool open = false;
    for_each_line(chunk.bytes, chunk.first_line, [&](std::string_view line, size_t) {
      const bool is_blank = blank(line);
      if (c.options->text_line_per_doc) {
        if (!is_blank) text_document(p, line, c);
        return;
      }
      if (is_blank) {
        if (open) text_document(p, cur, c);
        cur.clear();
        open = false;
        return;
      }
      if (open) cur.push_back('\n');
      cur.append(line);
      open = true;
    });
    if (open) text_document(p, cur, c);
    return;
  }
  auto render = [&](const SftRecord& rec) {
    const SftTokens t = sft_render(rec, *c.tokenizer, c.tmpl, c.options->add_bos, c.options->train_on_prompt);
    piece_add(p, t.tokens, &t.mask);
  };
  // A pair is two documents, chosen then rejected; neither is ever empty (each side ends
  // with its answer's end of turn), so the pairing holds.
  auto render_pair = [&](const PairRecord& rec) {
    const PairTokens t = pair_render(rec, *c.tokenizer, c.tmpl, c.options->add_bos, c.options->train_on_prompt);
    DT_ENFORCE(!t.chosen.tokens.empty() && !t.rejected.tokens.empty(), InternalError, "{}: an empty side of a pair",
               rec.source);
    piece_add(p, t.chosen.tokens, &t.chosen.mask);
    piece_add(p, t.rejected.tokens, &t.rejected.mask);
  };
  if (!c.entry) {
    for_each_line(chunk.bytes, chunk.first_line, [&](std::string_view line, size_t line_no) {
      if (blank(line)) return;
      if (c.format == DataFormat::PAIRWISE) render_pair(pair_parse_line(line, c.input, line_no));
      else render(sft_parse_line(line, c.sft_format, c.input, line_no));
    });
    return;
  }
  auto one = [&](std::string_view text, size_t line, size_t index) {
    if (c.entry->ranking) render_pair(llamafactory_pair_record(*c.entry, text, line, index));
    else render(llamafactory_record(*c.entry, text, line, index));
  };
  size_t index = chunk.first_record;
  if (!chunk.records.empty()) {
    for (const Record& r : chunk.records)
      one(std::string_view(chunk.bytes).substr(r.offset, r.length), r.line, index++);
    return;
  }
  for_each_line(chunk.bytes, chunk.first_line, [&](std::string_view line, size_t line_no) {
    if (!blank_lf(line)) one(line, line_no, index++);
  });
}

// ---------------------------------------------------------------------------
// Workers

class Pool {
 public:
  Pool(unsigned threads, const Context& ctx) : ctx_(ctx) {
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
      queue_.clear();
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  void submit(size_t seq, Chunk&& chunk) {
    {
      std::lock_guard<std::mutex> l(m_);
      queue_.emplace_back(seq, std::move(chunk));
    }
    work_cv_.notify_one();
  }

  // The result of chunk `seq`, waiting for it; rethrows the chunk's error.
  TokenPiece take(size_t seq) {
    std::unique_lock<std::mutex> l(m_);
    done_cv_.wait(l, [&] { return done_.count(seq) != 0; });
    Result r = std::move(done_[seq]);
    done_.erase(seq);
    l.unlock();
    if (r.error) std::rethrow_exception(r.error);
    return std::move(r.piece);
  }

  // Hands a piece the sink is done with back for a later chunk.
  void recycle(TokenPiece&& piece) {
    std::lock_guard<std::mutex> l(m_);
    spare_.push_back(std::move(piece));
  }

  // An input buffer a worker is done with (empty, with its capacity), or a new one.
  std::string spare_bytes() {
    std::lock_guard<std::mutex> l(m_);
    if (spare_bytes_.empty()) return {};
    std::string b = std::move(spare_bytes_.back());
    spare_bytes_.pop_back();
    return b;
  }

 private:
  struct Result {
    TokenPiece piece;
    std::exception_ptr error;
  };

  void work() {
    for (;;) {
      std::pair<size_t, Chunk> job;
      Result r;
      {
        std::unique_lock<std::mutex> l(m_);
        work_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
        if (!spare_.empty()) {
          r.piece = std::move(spare_.back());
          spare_.pop_back();
        }
      }
      try {
        chunk_tokenize(job.second, ctx_, r.piece);
      } catch (...) {
        r.error = std::current_exception();
      }
      job.second.bytes.clear();  // kept for a later chunk: see chunk_tokenize
      {
        std::lock_guard<std::mutex> l(m_);
        done_.emplace(job.first, std::move(r));
        spare_bytes_.push_back(std::move(job.second.bytes));
      }
      done_cv_.notify_all();
    }
  }

  const Context& ctx_;
  std::mutex m_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::pair<size_t, Chunk>> queue_;
  std::map<size_t, Result> done_;
  std::vector<TokenPiece> spare_;
  std::vector<std::string> spare_bytes_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

unsigned data_prepare_threads(const DataPrepareOptions& options) {
  if (options.threads > 0) return options.threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

// Tokenizes the chunks next() gives on `threads` threads; sink gets them in order.
void chunks_run(const Context& ctx, unsigned threads, const std::function<bool(Chunk&)>& next,
                const std::function<void(const TokenPiece&)>& sink) {
  Chunk chunk;
  if (threads == 1) {
    TokenPiece piece;
    while (next(chunk)) {
      chunk_tokenize(chunk, ctx, piece);
      sink(piece);
    }
    return;
  }
  // Up to 2 chunks per worker in flight (queued, being tokenized, or waiting for their
  // turn at the sink): enough to keep every worker busy while the main thread reads and
  // writes, and the bound on memory.
  const size_t max_in_flight = 2 * static_cast<size_t>(threads);
  Pool pool(threads, ctx);
  size_t submitted = 0, taken = 0;
  bool more = true;
  for (;;) {
    while (more && submitted - taken < max_in_flight) {
      chunk.bytes = pool.spare_bytes();
      if (!next(chunk)) {
        more = false;
        break;
      }
      pool.submit(submitted++, std::move(chunk));
      chunk = Chunk{};
    }
    if (taken == submitted) return;
    TokenPiece piece = pool.take(taken++);
    sink(piece);
    pool.recycle(std::move(piece));
  }
}

}  // namespace

void data_tokenize_stream(const std::string& input, DataFormat format, const Tokenizer& tokenizer,
                          const DataPrepareOptions& options, const std::function<void(const TokenPiece&)>& sink) {
  Context ctx{input, format, &tokenizer, &options, SftTemplate{}};
  const bool text = format == DataFormat::TEXT;
  if (!text) {
    ctx.tmpl = sft_template_parse(options.sft_template, &tokenizer);
    ctx.sft_format = format == DataFormat::CHAT     ? SftFormat::CHAT
                     : format == DataFormat::ALPACA ? SftFormat::ALPACA
                                                    : SftFormat::AUTO;
  }
  const char* what = text ? "text data" : format == DataFormat::PAIRWISE ? "pairwise data" : "SFT data";
  ChunkReader reader(input, what, options.chunk_bytes, text && !options.text_line_per_doc);
  chunks_run(
      ctx, data_prepare_threads(options), [&](Chunk& c) { return reader.next(c); }, sink);
}

void data_tokenize_stream_llamafactory(const std::vector<LlamaFactoryEntry>& entries, const Tokenizer& tokenizer,
                                       const DataPrepareOptions& options,
                                       const std::function<void(const TokenPiece&)>& sink) {
  const SftTemplate tmpl = sft_template_parse(options.sft_template, &tokenizer);
  const unsigned threads = data_prepare_threads(options);
  size_t base = 0;  // bytes of the datasets before this one
  for (const LlamaFactoryEntry& e : entries) {
    Context ctx{e.file, DataFormat::SFT, &tokenizer, &options, tmpl, SftFormat::AUTO, &e};
    size_t records = 0, bytes = 0;
    if (fs::path(e.file).extension() == ".jsonl") {
      ChunkReader reader(e.file, "LLaMA-Factory dataset", options.chunk_bytes, false, true);
      chunks_run(
          ctx, threads,
          [&](Chunk& c) {
            if (!reader.next(c)) return false;
            bytes = c.input_end;
            c.input_end += base;
            return true;
          },
          sink);
      records = reader.records();
    } else {
      // A .json array is one JSON value: read whole (it is the datasets' own layout), its
      // records handed on in chunks.
      const std::string text = input_file_read(e.file, "LLaMA-Factory dataset", kInputAnySize);
      std::vector<Record> all;
      llamafactory_json_elements(text, e.file, [&](std::string_view rec, size_t line) {
        all.push_back({static_cast<size_t>(rec.data() - text.data()), rec.size(), line});
      });
      records = all.size();
      size_t at = 0;
      chunks_run(
          ctx, threads,
          [&](Chunk& c) {
            if (at == all.size()) return false;
            c.bytes.clear();
            c.records.clear();
            c.first_record = at;
            while (at < all.size() && (c.bytes.empty() || c.bytes.size() < options.chunk_bytes)) {
              c.records.push_back({c.bytes.size(), all[at].length, all[at].line});
              c.bytes.append(text, all[at].offset, all[at].length);
              ++at;
            }
            bytes = at == all.size() ? text.size() : all[at].offset;
            c.input_end = base + bytes;
            return true;
          },
          sink);
    }
    DT_ENFORCE(records > 0, ConfigError, "{}: dataset '{}' holds no records", e.file, e.name);
    base += bytes;
  }
}

}  // namespace dtrain::data
