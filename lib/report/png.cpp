// PNG writer: the PNG chunk layout for an 8-bit indexed-colour image; deflate and the
// CRC-32 / Adler-32 checksums are zlib's.
#include "report/png.h"

#include "core/check.h"

#include <zlib.h>

#include <algorithm>
#include <fstream>

namespace dtrain::report {

namespace {

void chunk(std::string& out, const char* type, const std::string& body) {
  auto be32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
  };
  be32(static_cast<uint32_t>(body.size()));
  std::string typed = std::string(type, 4) + body;
  out += typed;
  be32(
      static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(typed.data()), static_cast<uInt>(typed.size()))));
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

std::string zlib_compress(const uint8_t* data, size_t n) {
  // Fixed Huffman codes (Z_FIXED): plots are a few colours in long runs and rows that
  // repeat the one above, which LZ77 matches catch; dynamic code tables gain little there.
  z_stream zs{};
  DT_ENFORCE(deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15, 8, Z_FIXED) == Z_OK, InternalError,
             "zlib: deflateInit2 failed");
  std::string out(deflateBound(&zs, static_cast<uLong>(n)), '\0');
  zs.next_in = const_cast<Bytef*>(data);
  zs.avail_in = static_cast<uInt>(n);
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  DT_ENFORCE(rc == Z_STREAM_END, InternalError, "zlib: deflate returned {} for {} bytes", rc, n);
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
  for (const Rgb& c : img.palette)
    plte += std::string{static_cast<char>(c[0]), static_cast<char>(c[1]), static_cast<char>(c[2])};
  chunk(out, "PLTE", plte);
  chunk(out, "tEXt", std::string(kPngSoftware, sizeof kPngSoftware - 1));  // marks dtrain's own plots
  const size_t row = static_cast<size_t>(img.width) + 1;
  std::vector<uint8_t> raw(row * static_cast<size_t>(img.height));
  for (int y = 0; y < img.height; ++y) {
    raw[static_cast<size_t>(y) * row] = 0;  // filter: none
    std::copy_n(img.pixels.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(y) * static_cast<size_t>(img.width)),
                img.width, raw.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(y) * row + 1));
  }
  chunk(out, "IDAT", zlib_compress(raw.data(), raw.size()));
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

bool png_is_dtrain_plot(const std::string& path, bool any_png) {
  // The signature, IHDR (8 + 25 bytes), then PLTE of at most 256 colours and our tEXt.
  std::ifstream in(path, std::ios::binary);
  std::string head(8 + 25 + 12 + 3 * 256 + 12 + sizeof kPngSoftware, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  if (head.rfind(std::string("\x89PNG\r\n\x1a\n", 8), 0) != 0) return false;
  return any_png || head.find("tEXt" + std::string(kPngSoftware, sizeof kPngSoftware - 1)) != std::string::npos;
}

}  // namespace dtrain::report
