// PNG writer: CRC-32, Adler-32, a small fixed-Huffman deflate with run and row-above
// matches, and the PNG chunk layout for an 8-bit indexed-colour image.
#include "report/png.h"

#include "core/check.h"

#include <algorithm>
#include <fstream>

namespace dtrain::report {

namespace {

// Deflate's bit stream: values packed from the least significant bit up.
class BitWriter {
 public:
  explicit BitWriter(std::string& out) : out_(out) {}
  void bits(uint32_t value, int count) {
    acc_ |= static_cast<uint64_t>(value) << nbits_;
    nbits_ += count;
    while (nbits_ >= 8) {
      out_.push_back(static_cast<char>(acc_ & 0xff));
      acc_ >>= 8;
      nbits_ -= 8;
    }
  }
  // Huffman codes go most significant bit first.
  void code(uint32_t code, int len) {
    uint32_t rev = 0;
    for (int i = 0; i < len; ++i) rev |= ((code >> i) & 1u) << (len - 1 - i);
    bits(rev, len);
  }
  void flush() {
    if (nbits_ > 0) bits(0, 8 - nbits_);
  }

 private:
  std::string& out_;
  uint64_t acc_ = 0;
  int nbits_ = 0;
};

// Fixed Huffman literal/length code (RFC 1951 3.2.6).
void put_litlen(BitWriter& bw, int sym) {
  if (sym < 144) bw.code(0x30 + static_cast<uint32_t>(sym), 8);
  else if (sym < 256) bw.code(0x190 + static_cast<uint32_t>(sym - 144), 9);
  else if (sym < 280) bw.code(static_cast<uint32_t>(sym - 256), 7);
  else bw.code(0xc0 + static_cast<uint32_t>(sym - 280), 8);
}

constexpr int kLenBase[29] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr int kLenExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr int kDistBase[30] = {1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr int kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

void put_match(BitWriter& bw, int len, int dist) {
  int l = 28;
  while (kLenBase[l] > len) --l;
  put_litlen(bw, 257 + l);
  if (kLenExtra[l]) bw.bits(static_cast<uint32_t>(len - kLenBase[l]), kLenExtra[l]);
  int d = 29;
  while (kDistBase[d] > dist) --d;
  bw.code(static_cast<uint32_t>(d), 5);
  if (kDistExtra[d]) bw.bits(static_cast<uint32_t>(dist - kDistBase[d]), kDistExtra[d]);
}

size_t match_length(const uint8_t* data, size_t n, size_t pos, size_t dist) {
  if (dist == 0 || dist > pos) return 0;
  size_t len = 0;
  while (len < 258 && pos + len < n && data[pos + len] == data[pos + len - dist]) ++len;
  return len;
}

void chunk(std::string& out, const char* type, const std::string& body) {
  auto be32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
  };
  be32(static_cast<uint32_t>(body.size()));
  std::string typed = std::string(type, 4) + body;
  out += typed;
  be32(png_crc32(reinterpret_cast<const uint8_t*>(typed.data()), typed.size()));
}

}  // namespace

// ---------------------------------------------------------------------------

Image::Image(int w, int h, Rgb background) : width(w), height(h) {
  DT_ENFORCE(w > 0 && h > 0 && w <= 16384 && h <= 16384, ConfigError, "image size {}x{} is outside 1..16384", w, h);
  palette.push_back(background);
  pixels.assign(static_cast<size_t>(w) * static_cast<size_t>(h), 0);
}

uint8_t Image::color(Rgb c) {
  for (size_t i = 0; i < palette.size(); ++i)
    if (palette[i] == c) return static_cast<uint8_t>(i);
  DT_ENFORCE_LT(palette.size(), size_t{256}, InternalError, "an indexed image holds at most 256 colours");
  palette.push_back(c);
  return static_cast<uint8_t>(palette.size() - 1);
}

uint32_t png_crc32(const uint8_t* data, size_t n, uint32_t crc) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t png_adler32(const uint8_t* data, size_t n) {
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < n; ++i) {
    a = (a + data[i]) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

std::string zlib_compress(const uint8_t* data, size_t n, size_t stride) {
  std::string out;
  out.push_back(0x78);  // CM 8 (deflate), 32K window
  out.push_back(0x01);  // FCHECK: (0x78 * 256 + 0x01) % 31 == 0, fastest
  BitWriter bw(out);
  // One fixed-Huffman block per 64 KiB of input keeps each block's work bounded.
  size_t pos = 0;
  do {
    const size_t end = std::min(n, pos + 65536);
    bw.bits(end == n ? 1u : 0u, 1);  // BFINAL
    bw.bits(1, 2);                    // BTYPE 01: fixed Huffman
    while (pos < end) {
      size_t best = match_length(data, end, pos, 1), dist = 1;
      if (stride > 1 && stride <= 32768) {
        size_t up = match_length(data, end, pos, stride);
        if (up > best) best = up, dist = stride;
      }
      if (best >= 3) {
        put_match(bw, static_cast<int>(best), static_cast<int>(dist));
        pos += best;
      } else {
        put_litlen(bw, data[pos]);
        ++pos;
      }
    }
    put_litlen(bw, 256);  // end of block
  } while (pos < n);
  bw.flush();
  const uint32_t adler = png_adler32(data, n);
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((adler >> s) & 0xff));
  return out;
}

std::string png_encode(const Image& img) {
  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  auto be32 = [](std::string& s, uint32_t v) {
    for (int sh = 24; sh >= 0; sh -= 8) s.push_back(static_cast<char>((v >> sh) & 0xff));
  };
  be32(ihdr, static_cast<uint32_t>(img.width));
  be32(ihdr, static_cast<uint32_t>(img.height));
  ihdr += std::string("\x08\x03\x00\x00\x00", 5);  // depth 8, indexed, deflate, filter 0, no interlace
  chunk(out, "IHDR", ihdr);
  std::string plte;
  for (const Rgb& c : img.palette) plte += std::string{static_cast<char>(c[0]), static_cast<char>(c[1]), static_cast<char>(c[2])};
  chunk(out, "PLTE", plte);
  const size_t row = static_cast<size_t>(img.width) + 1;
  std::vector<uint8_t> raw(row * static_cast<size_t>(img.height));
  for (int y = 0; y < img.height; ++y) {
    raw[static_cast<size_t>(y) * row] = 0;  // filter: none
    std::copy_n(img.pixels.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(y) * static_cast<size_t>(img.width)),
                img.width, raw.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(y) * row + 1));
  }
  chunk(out, "IDAT", zlib_compress(raw.data(), raw.size(), row));
  chunk(out, "IEND", "");
  return out;
}

void png_write(const Image& img, const std::string& path) {
  const std::string bytes = png_encode(img);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DT_ENFORCE(out.good(), IoError, "cannot open {} for writing; check the directory exists and is writable", path);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  DT_ENFORCE(out.good(), IoError, "cannot write {} (disk full?)", path);
}

}  // namespace dtrain::report
