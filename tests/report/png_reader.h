// A minimal PNG reader for tests, independent of lib/report's writer: chunk CRCs
// (bitwise), IHDR, palette, and inflate of stored and fixed-Huffman deflate blocks with
// the Adler-32 check. Fails the calling doctest case on malformed input.
#pragma once

#include "report/png.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::test {

using report::Rgb;

// ---- a minimal PNG reader, independent of the writer

inline uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

inline uint32_t crc_bitwise(const std::string& s) {  // bit by bit, no table: independent of png_crc32
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

struct BitReader {
  const std::string& s;
  size_t pos = 0;
  int bit = 0;
  uint32_t get(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (pos >= s.size()) throw std::runtime_error("deflate stream ends early");
      v |= uint32_t((uint8_t(s[pos]) >> bit) & 1u) << i;
      if (++bit == 8) bit = 0, ++pos;
    }
    return v;
  }
  uint32_t get_rev(int n) {  // Huffman code bits, MSB first
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 1) | get(1);
    return v;
  }
};

// Fixed-Huffman literal/length symbol: read 7 bits, then extend as the code table says.
inline int fixed_litlen(BitReader& br) {
  uint32_t c = br.get_rev(7);
  if (c <= 0x17) return int(c) + 256;
  c = (c << 1) | br.get(1);
  if (c >= 0x30 && c <= 0xbf) return int(c - 0x30);
  if (c >= 0xc0 && c <= 0xc7) return int(c - 0xc0) + 280;
  c = (c << 1) | br.get(1);
  REQUIRE(c >= 0x190);
  REQUIRE(c <= 0x1ff);
  return int(c - 0x190) + 144;
}

inline std::string inflate(const std::string& z) {
  REQUIRE(z.size() >= 6);
  REQUIRE((uint8_t(z[0]) * 256 + uint8_t(z[1])) % 31 == 0);
  REQUIRE((uint8_t(z[0]) & 0x0f) == 8);
  static const int lbase[] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                              31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
  static const int lext[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
  static const int dbase[] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                              193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
  static const int dext[] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                             6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
  std::string out;
  BitReader br{z, 2, 0};
  for (bool final = false; !final;) {
    final = br.get(1);
    uint32_t type = br.get(2);
    if (type == 0) {
      if (br.bit) br.bit = 0, ++br.pos;
      uint32_t len = uint8_t(z[br.pos]) | (uint8_t(z[br.pos + 1]) << 8);
      uint32_t nlen = uint8_t(z[br.pos + 2]) | (uint8_t(z[br.pos + 3]) << 8);
      REQUIRE((len ^ 0xffffu) == nlen);
      out += z.substr(br.pos + 4, len);
      br.pos += 4 + len;
    } else {
      REQUIRE(type == 1);  // the writer emits fixed-Huffman blocks only
      for (;;) {
        int sym = fixed_litlen(br);
        if (sym < 256) {
          out.push_back(char(sym));
        } else if (sym == 256) {
          break;
        } else {
          int l = sym - 257;
          REQUIRE(l < 29);
          int len = lbase[l] + int(br.get(lext[l]));
          int d = int(br.get_rev(5));
          REQUIRE(d < 30);
          size_t dist = size_t(dbase[d]) + br.get(dext[d]);
          if (dist > out.size()) throw std::runtime_error("distance beyond the output");
          for (int i = 0; i < len; ++i) out.push_back(out[out.size() - dist]);
        }
      }
    }
  }
  if (br.bit) ++br.pos;
  REQUIRE(br.pos + 4 == z.size());
  uint32_t a = 1, b = 0;
  for (unsigned char c : out) a = (a + c) % 65521, b = (b + a) % 65521;
  CHECK(be32(z, br.pos) == ((b << 16) | a));
  return out;
}

struct Decoded {
  int width = 0, height = 0;
  std::vector<Rgb> pixels;
  Rgb at(int x, int y) const { return pixels[size_t(y) * size_t(width) + size_t(x)]; }
};

inline Decoded png_decode(const std::string& png) {
  REQUIRE(png.size() > 8);
  REQUIRE(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  Decoded d;
  std::vector<Rgb> palette;
  std::string idat;
  bool ended = false;
  int depth = 0, ctype = 0;
  for (size_t at = 8; at < png.size();) {
    REQUIRE(!ended);
    uint32_t len = be32(png, at);
    REQUIRE(at + 12 + len <= png.size());
    std::string type = png.substr(at + 4, 4), body = png.substr(at + 8, len);
    CHECK(be32(png, at + 8 + len) == crc_bitwise(type + body));
    if (type == "IHDR") {
      REQUIRE(len == 13);
      d.width = int(be32(body, 0));
      d.height = int(be32(body, 4));
      depth = uint8_t(body[8]);
      ctype = uint8_t(body[9]);
    } else if (type == "PLTE") {
      REQUIRE(len % 3 == 0);
      for (size_t i = 0; i < len; i += 3)
        palette.push_back({uint8_t(body[i]), uint8_t(body[i + 1]), uint8_t(body[i + 2])});
    } else if (type == "IDAT") {
      idat += body;
    } else if (type == "IEND") {
      ended = true;
    }
    at += 12 + len;
  }
  REQUIRE(ended);
  REQUIRE(depth == 8);
  REQUIRE(ctype == 3);
  std::string raw = inflate(idat);
  REQUIRE(raw.size() == size_t(d.height) * size_t(d.width + 1));
  for (int y = 0; y < d.height; ++y) {
    size_t row = size_t(y) * size_t(d.width + 1);
    REQUIRE(raw[row] == 0);
    for (int x = 0; x < d.width; ++x) {
      size_t idx = uint8_t(raw[row + 1 + size_t(x)]);
      if (idx >= palette.size()) throw std::runtime_error("pixel index beyond the palette");
      d.pixels.push_back(palette[idx]);
    }
  }
  return d;
}

}  // namespace dtrain::test
