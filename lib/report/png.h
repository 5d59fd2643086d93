// The PNG writer for the run plots: an indexed-colour raster (palette of up to 256 RGB
// colours, one byte per pixel) in a zlib stream (zlib's deflate with fixed Huffman codes,
// its CRC-32 for the chunks).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::report {

using Rgb = std::array<uint8_t, 3>;

/// An indexed-colour image: pixel values index `palette`.
struct Image {
  int width = 0, height = 0;
  std::vector<Rgb> palette;     ///< 1..256 colours
  std::vector<uint8_t> pixels;  ///< row-major, width * height

  Image(int w, int h, Rgb background);
  /// Index of `c` in the palette, added when new. InternalError beyond 256 colours.
  uint8_t color(Rgb c);
  /// Sets a pixel; coordinates outside the image are ignored (clipping).
  void set(int x, int y, uint8_t index) {
    if (x >= 0 && y >= 0 && x < width && y < height)
      pixels[static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)] = index;
  }
  uint8_t at(int x, int y) const {
    return pixels[static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)];
  }
};

/// A zlib stream (RFC 1950/1951) of `data` through zlib: fixed-Huffman (or stored)
/// blocks, the Adler-32 trailer.
std::string zlib_compress(const uint8_t* data, size_t n);

/// The PNG file bytes: IHDR (8-bit indexed colour), PLTE, one IDAT, IEND; every
/// scanline uses filter type 0.
std::string png_encode(const Image& img);

/// Writes png_encode(img) to `path`. IoError naming the path when it cannot.
void png_write(const Image& img, const std::string& path);

/// The tEXt chunk png_encode writes ("Software" keyword, NUL, value): marks dtrain's plots.
inline constexpr char kPngSoftware[] = "Software\0dtrain plot";

/// True when `path` is a PNG png_encode wrote (its tEXt chunk), or with any_png any PNG.
bool png_is_dtrain_plot(const std::string& path, bool any_png = false);

}  // namespace dtrain::report
