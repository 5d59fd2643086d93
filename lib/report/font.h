// A built-in 5x7 bitmap font (digits, A-Z, lower case drawn as upper case, and the
// punctuation plot labels need) for drawing axis ticks and titles onto an Image.
#pragma once

#include "report/png.h"

#include <string_view>

namespace dtrain::report {

/// Glyph cell: 5x7 pixels plus one column of spacing, times `scale`.
inline constexpr int FONT_W = 5, FONT_H = 7, FONT_ADVANCE = 6;

/// Width in pixels of `text` drawn at `scale`.
int text_width(std::string_view text, int scale);

/// Draws `text` with its top-left corner at (x, y). Characters without a glyph are drawn
/// as a hollow box so they are visibly wrong rather than silently missing.
void text_draw(Image& img, int x, int y, std::string_view text, uint8_t color, int scale);

/// True when `c` has a glyph (lower-case letters map to upper case).
bool font_has(char c);

}  // namespace dtrain::report
