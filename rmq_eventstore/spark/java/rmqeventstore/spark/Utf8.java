package rmqeventstore.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;

/** Strict UTF-8 validation (as Arrow's string check and {@code _spark_native}'s {@code utf8_valid}) and
 * Python's {@code bytes.decode("utf-8", "replace")} for text that fails it. */
final class Utf8 {
  private static final VarHandle LONG = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final long HIGH_BITS = 0x8080808080808080L;

  private Utf8() {
  }

  static boolean valid(byte[] s, int off, int n) {
    int i = off;
    int end = off + n;
    while (i < end) {
      while (i + 8 <= end && ((long) LONG.get(s, i) & HIGH_BITS) == 0) {
        i += 8;  // eight ASCII bytes at a time
      }
      if (i >= end) {
        break;
      }
      int c = s[i] & 0xFF;
      if (c < 0x80) {
        i++;
        continue;
      }
      if (c >= 0xC2 && c <= 0xDF) {
        if (i + 1 >= end || (s[i + 1] & 0xC0) != 0x80) {
          return false;
        }
        i += 2;
      } else if (c >= 0xE0 && c <= 0xEF) {
        if (i + 2 >= end) {
          return false;
        }
        int c1 = s[i + 1] & 0xFF;
        if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) {
          return false;
        }
        if (c == 0xE0 && c1 < 0xA0 || c == 0xED && c1 > 0x9F) {
          return false;
        }
        i += 3;
      } else if (c >= 0xF0 && c <= 0xF4) {
        if (i + 3 >= end) {
          return false;
        }
        int c1 = s[i + 1] & 0xFF;
        if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) {
          return false;
        }
        if (c == 0xF0 && c1 < 0x90 || c == 0xF4 && c1 > 0x8F) {
          return false;
        }
        i += 4;
      } else {
        return false;
      }
    }
    return true;
  }

  /** The bytes decoded with U+FFFD for each maximal ill-formed subsequence, re-encoded as UTF-8. */
  static byte[] replace(byte[] s, int off, int n) {
    return new String(s, off, n, StandardCharsets.UTF_8).getBytes(StandardCharsets.UTF_8);
  }
}
