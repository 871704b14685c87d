// printable(): what another node wrote cannot rewrite the terminal or flood it.
#include <catch2/catch.hpp>

#include "drun/common/safe_text.hpp"

using drun::text::printable;
using drun::text::SafeTextOptions;

TEST_CASE("printable: plain text and UTF-8 pass unchanged", "[text]") {
  CHECK(printable("worker 3 failed: CUDA out of memory") ==
        "worker 3 failed: CUDA out of memory");
  CHECK(printable("n\xC5\x93ud \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80") ==
        "n\xC5\x93ud \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80");
  CHECK(printable("").empty());
}

TEST_CASE("printable: escape sequences and other controls are replaced", "[text]") {
  // Clear the screen, set the window title, ring the bell, move the cursor back.
  CHECK(printable("a\x1b[2Jb") == "a?[2Jb");
  CHECK(printable("\x1b]0;owned\x07") == "?]0;owned?");
  CHECK(printable("ok\rFAKE") == "okFAKE");
  CHECK(printable("x\x08\x7fy") == "x??y");
  CHECK(printable(std::string("nul\0byte", 8)) == "nul?byte");
  // C1 CSI (U+009B) in UTF-8, and a right-to-left override.
  CHECK(printable("a\xC2\x9B" "2Jb") == "a?2Jb");
  CHECK(printable("file\xE2\x80\xAEtxt.exe") == "file?txt.exe");
  // Not UTF-8: lone continuation, overlong '/', a surrogate, a truncated sequence.
  CHECK(printable("\x80\xC0\xAF\xED\xA0\x80z\xE6\x97") == "??????z??");
}

TEST_CASE("printable: newlines and tabs kept only when asked", "[text]") {
  CHECK(printable("line1\nline2\tend") == "line1 line2 end");
  SafeTextOptions multi;
  multi.multiLine = true;
  CHECK(printable("line1\r\nline2\tend", multi) == "line1\nline2\tend");
}

TEST_CASE("printable: long text is cut on a character boundary and says so", "[text]") {
  SafeTextOptions o;
  o.maxBytes = 10;
  CHECK(printable(std::string(16u << 20, 'x'), o) ==
        "xxxxxxxxxx ... (" + std::to_string((16u << 20) - 10) + " more bytes)");
  // 4 three-byte characters: only 3 fit in 10 bytes, the fourth is not split.
  std::string jp = "\xE6\x97\xA5\xE6\x97\xA5\xE6\x97\xA5\xE6\x97\xA5";
  CHECK(printable(jp, o) == "\xE6\x97\xA5\xE6\x97\xA5\xE6\x97\xA5 ... (3 more bytes)");
  o.maxBytes = 5;
  CHECK(printable("abcde", o) == "abcde");
}
