package rmqeventstore.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.zip.CRC32;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads the records of one {@link RocketMQJvmSource.SegmentRange} into columnar batches, with the rules of
 * {@code rmq_eventstore.spark.decode}: the walk stops at a BLANK record, zeroed space or a size/magic
 * damage; every record is validated as {@code decode.record_layout} does and the first invalid one ends
 * the range; the values are those of the Python decoder (hosts in Java's text, properties as
 * {@code string_to_properties}: the last duplicate wins at the first one's place, text that is not
 * UTF-8 decoded with replacement characters, {@code msg_id} the offsetMsgId).
 *
 * <p>The segment is mapped read-only; its bytes are copied a window (1 MiB) at a time into a heap array,
 * where the walk, the validation and the decode read them (so a live writer cannot change a record in
 * between), and zeroed space is skipped with a vectorised compare when a range re-synchronises.
 */
final class SegmentReader implements PartitionReader<ColumnarBatch> {
  static final int MAGIC_V1 = 0xDAA320A7;
  static final int MAGIC_V2 = 0xDAA320AB;
  static final int MAGIC_BLANK = 0xCBD43194;
  static final int BORNHOST_V6 = 0x10;
  static final int STOREHOST_V6 = 0x20;
  static final int MAX_ROWS = 4096;
  static final int WINDOW = 1 << 20;  // bytes copied from the mapping at a time (a batch lies in one window)

  private static final VarHandle INT = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.BIG_ENDIAN);
  private static final VarHandle LONG = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.BIG_ENDIAN);
  private static final VarHandle SHORT = MethodHandles.byteArrayViewVarHandle(short[].class, ByteOrder.BIG_ENDIAN);
  private static final ByteBuffer ZEROS = ByteBuffer.allocateDirect(1 << 16);
  private static final byte[] HEX = "0123456789ABCDEF".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] TAGS = "TAGS".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] KEYS = "KEYS".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] UNIQ = "UNIQ_KEY".getBytes(StandardCharsets.US_ASCII);

  private final RocketMQJvmSource.SegmentRange part;
  private final boolean verifyCrc;
  private final byte[][] topics;  // sorted, null: every topic
  private final FileChannel channel;
  private final MappedByteBuffer mm;
  private final int limit;
  private int pos;
  private int stop;
  private boolean done;

  private byte[] buf = new byte[0];
  private int bufPos;  // file position of buf[0]
  private int bufLen;  // bytes of the file in buf
  private final int[] starts = new int[MAX_ROWS];
  // by position in the full schema, null where the column is not read (pruned): the fixed-width columns,
  // the string and binary ones, and the properties map
  private final WritableColumnVector[] cols;
  private final BytesColumn[] text;
  private final BytesColumn.MapColumn props;
  private final ColumnVector[] outCols;  // the read schema's columns, in its order
  private final boolean wantProps;
  private final ColumnarBatch batch;
  private final CRC32 crc = new CRC32();
  // properties pairs of the record being decoded: key start/len, value start/len (positions in src)
  private int[] ks = new int[64];
  private int[] kl = new int[64];
  private int[] vs = new int[64];
  private int[] vl = new int[64];
  private final byte[] idText = new byte[56];
  private final HostCache bornCache = new HostCache();
  private final HostCache storeCache = new HostCache();

  SegmentReader(RocketMQJvmSource.SegmentRange part, Long fileSize, boolean verifyCrc, byte[][] topics,
                String[] columns) {
    this.part = part;
    this.verifyCrc = verifyCrc;
    this.topics = topics;
    try {
      channel = FileChannel.open(Paths.get(part.path), StandardOpenOption.READ);
      long size = channel.size();
      if (fileSize != null) {
        size = Math.min(size, fileSize);
      }
      if (size > Integer.MAX_VALUE) {
        throw new IllegalStateException(part.path + ": commitlog segments over 2 GiB are not supported");
      }
      limit = (int) size;
      mm = limit > 0 ? channel.map(FileChannel.MapMode.READ_ONLY, 0, limit) : null;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    StructField[] fields = RocketMQJvmSource.SCHEMA.fields();
    cols = new WritableColumnVector[fields.length];
    text = new BytesColumn[fields.length];
    outCols = new ColumnVector[columns.length];
    BytesColumn.MapColumn map = null;
    for (int o = 0; o < columns.length; o++) {
      int i = RocketMQJvmSource.SCHEMA.fieldIndex(columns[o]);
      DataType t = fields[i].dataType();
      if (t instanceof MapType) {
        map = new BytesColumn.MapColumn(t, MAX_ROWS);
        outCols[o] = map;
      } else if (t instanceof StringType || t instanceof BinaryType) {
        text[i] = new BytesColumn(t, MAX_ROWS);
        outCols[o] = text[i];
      } else {
        cols[i] = new OnHeapColumnVector(MAX_ROWS, t);
        outCols[o] = cols[i];
      }
    }
    props = map;
    wantProps = text[13] != null || text[14] != null || text[15] != null || props != null;
    batch = new ColumnarBatch(outCols);
    stop = (int) Math.min(part.hi, limit);
    pos = (int) Math.min(part.lo, limit);
    if (limit == 0) {
      done = true;
    } else if (!part.exactStart) {
      int found = resync(pos, stop);
      if (found < 0) {
        done = true;
      } else {
        pos = found;
      }
    }
  }

  @Override
  public boolean next() {
    while (!done) {
      int n = walk();
      if (n == 0) {
        continue;  // walk() set done
      }
      int rows = decode(n, bufPos);
      if (rows > 0) {
        return true;
      }
    }
    return false;
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() throws IOException {
    batch.close();
    channel.close();
  }

  /**
   * Record starts from {@code pos} into {@code starts} ({@code decode.walk}); sets {@code done} at the end.
   * The records walked lie in {@code buf}, which holds the bytes of the file from {@code bufPos}: they are
   * copied from the mapping a window at a time (one sequential copy, then the walk and the decode read the
   * heap copy; a batch never spans two windows, so a live writer cannot change a record in between).
   */
  private int walk() {
    int n = 0;
    int p = pos;
    boolean broke = false;
    while (p < stop && n < MAX_ROWS) {
      if (limit - p < 8) {
        broke = true;  // zeroed tail or damage: the range ends either way
        break;
      }
      int off = p - bufPos;
      if (off + 8 > bufLen) {
        if (n > 0) {
          break;  // the next batch starts a new window
        }
        fill(p, 8);
        off = 0;
      }
      int total = (int) INT.get(buf, off);
      int magic = (int) INT.get(buf, off + 4);
      if (magic == MAGIC_V1 || magic == MAGIC_V2) {
        if (total <= 0 || (long) p + total > limit) {
          broke = true;
          break;
        }
        if (off + total > bufLen) {
          if (n > 0) {
            break;
          }
          fill(p, total);
        }
        starts[n++] = p;
        p += total;
        continue;
      }
      broke = true;  // BLANK, zeroed space or an illegal magic code
      break;
    }
    if (broke || p >= stop) {
      done = true;
    }
    pos = p;
    return n;
  }

  /** Copies the mapping from {@code at} into {@code buf}: a window (or {@code need} bytes, if more). */
  private void fill(int at, int need) {
    int len = Math.max(need, Math.min(WINDOW, limit - at));
    if (buf.length < len) {
      buf = new byte[Math.max(len, buf.length * 2)];
    }
    mm.get(at, buf, 0, len);
    bufPos = at;
    bufLen = len;
  }

  /** Header size up to and including BODYLEN (88 for IPv4 hosts), from the record's SYSFLAG. */
  private static int headerSize(int sysFlag) {
    return 80 + ((sysFlag & BORNHOST_V6) != 0 ? 16 : 4) + ((sysFlag & STOREHOST_V6) != 0 ? 16 : 4);
  }

  /**
   * The layout checks of {@code decode.record_layout} on the record at {@code s} of {@code a}, which holds
   * {@code total} bytes from {@code s}: returns the properties' start (> 0) or -1 when the record is invalid.
   */
  private static int validate(byte[] a, int s) {
    int total = (int) INT.get(a, s);
    int magic = (int) INT.get(a, s + 4);
    if (magic != MAGIC_V1 && magic != MAGIC_V2 || total < 48) {
      return -1;
    }
    int sysFlag = (int) INT.get(a, s + 36);
    int hsize = headerSize(sysFlag);
    if (total < hsize) {
      return -1;
    }
    boolean v2 = magic == MAGIC_V2;
    long recEnd = (long) s + total;
    int bodyPos = s + hsize;
    int bodyLen = (int) INT.get(a, bodyPos - 4);
    int tlw = v2 ? 2 : 1;
    if (bodyLen < 0 || (long) bodyPos + bodyLen + tlw > recEnd) {
      return -1;
    }
    int tpos = bodyPos + bodyLen;
    int tl = v2 ? (short) SHORT.get(a, tpos) : a[tpos] & 0xFF;
    if (tl < 0 || (!v2 && tl > 127)) {
      return -1;
    }
    long ppos = (long) tpos + tlw + tl;
    if (ppos + 2 > recEnd) {
      return -1;
    }
    int pl = (short) SHORT.get(a, (int) ppos);
    if (pl < 0 || ppos + 2 + pl != recEnd) {
      return -1;
    }
    return (int) ppos + 2;
  }

  /** {@code decode.resync}: the first record start in [{@code from}, {@code before}) (magic code,
   * PHYSICALOFFSET equal to its own log offset, and the record checks), -1 when none does. The search
   * stops at {@code before} (the range's end): a start past it belongs to the next range, and a range in
   * a segment's preallocated zeros must not scan every later range's zeros too. */
  private int resync(int from, int before) {
    byte[] rec = new byte[0];
    int i = from + 4;
    while ((long) i + 4 <= limit && i - 4 < before) {
      // skip eight bytes at a time while none of them is 0xDA, the first byte of both magic codes
      if ((long) i + 8 <= limit) {
        long w = mm.getLong(i);
        if (w == 0) {  // zeroed space (a segment's preallocated tail): skip the zero run, vectorised
          int len = Math.min(ZEROS.capacity(), limit - i);
          int m = mm.slice(i, len).mismatch(ZEROS.slice(0, len));
          i += m < 0 ? len : m;  // no magic code starts at a zero byte
          continue;
        }
        long x = w ^ 0xDADADADADADADADAL;
        if (((x - 0x0101010101010101L) & ~x & 0x8080808080808080L) == 0) {
          i += 8;
          continue;
        }
      }
      int m = mm.getInt(i);
      if (m != MAGIC_V1 && m != MAGIC_V2) {
        i++;
        continue;
      }
      int cand = i - 4;
      i++;
      if ((long) cand + 36 > limit || mm.getLong(cand + 28) != part.fileFrom + cand) {
        continue;
      }
      int total = mm.getInt(cand);
      if (total <= 0 || (long) cand + total > limit) {
        continue;
      }
      if (rec.length < total) {
        rec = new byte[total];
      }
      mm.get(cand, rec, 0, total);
      if (total >= 48 && validate(rec, 0) > 0) {
        return cand;
      }
    }
    return -1;
  }

  /** Decodes the {@code n} walked records (bytes from log position {@code base} in {@code buf}) into the
   * column vectors; returns the rows kept. The first invalid record ends the range. */
  private int decode(int n, int base) {
    for (ColumnVector v : outCols) {
      if (v instanceof WritableColumnVector) {
        ((WritableColumnVector) v).reset();
      } else if (v instanceof BytesColumn) {
        ((BytesColumn) v).reset();
      } else {
        ((BytesColumn.MapColumn) v).reset();
      }
    }
    WritableColumnVector[] c = cols;
    BytesColumn[] tx = text;
    BytesColumn.MapColumn mapV = props;
    BytesColumn mapK = mapV == null ? null : mapV.keys;
    BytesColumn mapVal = mapV == null ? null : mapV.values;
    List<Long> crcBad = null;
    byte[] a = buf;
    int row = 0;
    for (int i = 0; i < n; i++) {
      int s = starts[i] - base;
      int propsPos = validate(a, s);
      if (propsPos < 0) {
        done = true;
        break;
      }
      int total = (int) INT.get(a, s);
      boolean v2 = (int) INT.get(a, s + 4) == MAGIC_V2;
      int sysFlag = (int) INT.get(a, s + 36);
      int bl = (sysFlag & BORNHOST_V6) != 0 ? 16 : 4;
      int sl = (sysFlag & STOREHOST_V6) != 0 ? 16 : 4;
      int bornHost = s + 48;
      int storeTsPos = bornHost + bl + 4;
      int storeHost = storeTsPos + 8;
      int p = storeHost + sl + 4;
      int bodyPos = p + 16;
      int bodyLen = (int) INT.get(a, p + 12);
      int tlw = v2 ? 2 : 1;
      int topicPos = bodyPos + bodyLen + tlw;
      int tl = propsPos - 2 - topicPos;
      int pl = s + total - propsPos;
      // topic (and the topic filter, on the decoded text as the Python source compares it)
      byte[] tsrc = a;
      int toff = topicPos;
      if (!Utf8.valid(a, topicPos, tl)) {
        tsrc = Utf8.replace(a, topicPos, tl);
        toff = 0;
        tl = tsrc.length;
      }
      if (topics != null && !topicWanted(tsrc, toff, tl)) {
        continue;
      }
      if (tx[0] != null) {
        tx[0].put(tsrc, toff, tl);
      }
      if (c[1] != null) {
        c[1].putInt(row, (int) INT.get(a, s + 12));
      }
      if (c[2] != null) {
        c[2].putLong(row, (long) LONG.get(a, s + 20));
      }
      if (c[3] != null) {
        c[3].putLong(row, (long) LONG.get(a, s + 28));
      }
      if (c[4] != null) {
        c[4].putInt(row, total);
      }
      if (c[5] != null) {
        c[5].putInt(row, sysFlag);
      }
      if (c[6] != null) {
        c[6].putInt(row, (int) INT.get(a, s + 16));
      }
      if (c[7] != null) {
        c[7].putLong(row, (long) LONG.get(a, s + 40) * 1000L);
      }
      if (tx[8] != null) {
        byte[] t = bornCache.text(a, bornHost, bl);
        tx[8].put(t, 0, t.length);
      }
      if (c[9] != null) {
        c[9].putLong(row, (long) LONG.get(a, storeTsPos) * 1000L);
      }
      if (tx[10] != null) {
        byte[] t = storeCache.text(a, storeHost, sl);
        tx[10].put(t, 0, t.length);
      }
      if (c[11] != null) {
        c[11].putInt(row, (int) INT.get(a, p));
      }
      if (c[12] != null) {
        c[12].putLong(row, (long) LONG.get(a, p + 4));
      }
      if (wantProps) {  // properties: map, tags, keys, uniq_key
        byte[] psrc = a;
        int poff = propsPos;
        if (pl > 0 && !Utf8.valid(a, propsPos, pl)) {
          psrc = Utf8.replace(a, propsPos, pl);
          poff = 0;
          pl = psrc.length;
        }
        int np = splitProperties(psrc, poff, pl);
        int tagsI = -1;
        int keysI = -1;
        int uniqI = -1;
        for (int j = 0; j < np; j++) {
          if (mapK != null) {
            mapK.put(psrc, ks[j], kl[j]);
            mapVal.put(psrc, vs[j], vl[j]);
          }
          if (nameIs(psrc, ks[j], kl[j], TAGS)) {
            tagsI = j;
          } else if (nameIs(psrc, ks[j], kl[j], KEYS)) {
            keysI = j;
          } else if (nameIs(psrc, ks[j], kl[j], UNIQ)) {
            uniqI = j;
          }
        }
        if (mapV != null) {
          mapV.endRow(row);
        }
        putOptional(tx[13], psrc, tagsI);
        putOptional(tx[14], psrc, keysI);
        putOptional(tx[15], psrc, uniqI);
      }
      if (tx[17] != null) {
        tx[17].put(a, bodyPos, bodyLen);
      }
      if (tx[18] != null) {  // msg_id: store address + port + PHYSICALOFFSET in upper-case hex
        int w = 0;
        for (int j = 0; j < sl + 4; j++) {
          int b = a[storeHost + j] & 0xFF;
          idText[w++] = HEX[b >>> 4];
          idText[w++] = HEX[b & 15];
        }
        for (int j = 0; j < 8; j++) {
          int b = a[s + 28 + j] & 0xFF;
          idText[w++] = HEX[b >>> 4];
          idText[w++] = HEX[b & 15];
        }
        tx[18].put(idText, 0, w);
      }
      if (verifyCrc && bodyLen > 0) {
        crc.reset();
        crc.update(a, bodyPos, bodyLen);
        if ((int) (crc.getValue() & 0x7FFFFFFFL) != (int) INT.get(a, s + 8)) {
          if (crcBad == null) {
            crcBad = new ArrayList<>();
          }
          crcBad.add(part.fileFrom + starts[i]);
        }
      }
      row++;
    }
    if (crcBad != null) {
      StringBuilder sb = new StringBuilder();
      for (int j = 0; j < Math.min(10, crcBad.size()); j++) {
        sb.append(j == 0 ? "" : ", ").append(crcBad.get(j));
      }
      throw new IllegalStateException("BODYCRC mismatch in " + part.path + " at commitlog offset(s) " + sb
          + (crcBad.size() > 10 ? " ..." : "") + " (" + crcBad.size() + " record(s))");
    }
    batch.setNumRows(row);
    return row;
  }

  private boolean topicWanted(byte[] src, int off, int len) {
    for (byte[] t : topics) {
      if (t.length == len && Arrays.equals(t, 0, len, src, off, off + len)) {
        return true;
      }
    }
    return false;
  }

  private void putOptional(BytesColumn v, byte[] src, int j) {
    if (v == null) {
      return;
    }
    if (j < 0) {
      v.putNull();
    } else {
      v.put(src, vs[j], vl[j]);
    }
  }

  private static boolean nameIs(byte[] src, int off, int len, byte[] name) {
    return len == name.length && src[off] == name[0] && Arrays.equals(src, off, off + len, name, 0, len);
  }

  /**
   * {@code string_to_properties} on bytes: segments split at 0x02, the first 0x01 of a segment splits it
   * into name and value, both non-empty; a repeated name keeps its first place and takes the last value.
   * Fills ks/kl/vs/vl with positions in {@code p}; returns the number of pairs.
   */
  private int splitProperties(byte[] p, int off, int len) {
    int np = 0;
    int end = off + len;
    int s = off;
    while (s < end) {
      int e = s;
      int f = -1;  // the segment's first 0x01
      while (e < end) {
        byte b = p[e];
        if (b == 2) {
          break;
        }
        if (b == 1 && f < 0) {
          f = e;
        }
        e++;
      }
      if (f > s && f + 1 < e) {
        int klen = f - s;
        int dup = -1;
        for (int j = 0; j < np; j++) {
          if (kl[j] == klen && p[ks[j]] == p[s] && Arrays.equals(p, ks[j], ks[j] + klen, p, s, f)) {
            dup = j;
            break;
          }
        }
        if (dup >= 0) {
          vs[dup] = f + 1;
          vl[dup] = e - f - 1;
        } else {
          if (np == ks.length) {
            ks = Arrays.copyOf(ks, np * 2);
            kl = Arrays.copyOf(kl, np * 2);
            vs = Arrays.copyOf(vs, np * 2);
            vl = Arrays.copyOf(vl, np * 2);
          }
          ks[np] = s;
          kl[np] = klen;
          vs[np] = f + 1;
          vl[np] = e - f - 1;
          np++;
        }
      }
      s = e + 1;
    }
    return np;
  }

  /** Java's socket address text of the last host seen (hosts repeat): {@code a.b.c.d:port} or
   * {@code [x:x:x:x:x:x:x:x]:port}, an IPv4-mapped IPv6 address as IPv4 ({@code codec.format_host}). */
  private static final class HostCache {
    private final byte[] raw = new byte[20];
    private int rawLen = -1;
    private long raw8;  // an IPv4 address and port as one long
    private byte[] text = new byte[0];

    byte[] text(byte[] a, int at, int alen) {
      int len = alen + 4;
      boolean same;
      if (len == 8) {
        long x = (long) LONG.get(a, at);
        same = rawLen == 8 && x == raw8;
        raw8 = x;
      } else {
        same = len == rawLen && Arrays.equals(raw, 0, len, a, at, at + len);
        System.arraycopy(a, at, raw, 0, len);
      }
      if (!same) {
        rawLen = len;
        text = format(a, at, alen).getBytes(StandardCharsets.US_ASCII);
      }
      return text;
    }

    private static String format(byte[] a, int at, int alen) {
      int port = (int) INT.get(a, at + alen);
      boolean mapped = alen == 16;
      for (int i = 0; mapped && i < 12; i++) {
        mapped = a[at + i] == (i < 10 ? 0 : (byte) 0xFF);
      }
      if (alen == 4 || mapped) {
        int o = at + alen - 4;
        return (a[o] & 0xFF) + "." + (a[o + 1] & 0xFF) + "." + (a[o + 2] & 0xFF) + "." + (a[o + 3] & 0xFF)
            + ":" + port;
      }
      StringBuilder sb = new StringBuilder("[");
      for (int g = 0; g < 8; g++) {
        int v = ((a[at + 2 * g] & 0xFF) << 8) | (a[at + 2 * g + 1] & 0xFF);
        sb.append(g == 0 ? "" : ":").append(Integer.toHexString(v));
      }
      return sb.append("]:").append(port).toString();
    }
  }
}
