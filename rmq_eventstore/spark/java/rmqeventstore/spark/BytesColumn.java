package rmqeventstore.spark;

import java.util.Arrays;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A string or binary column of one batch: the values back to back in one array and n + 1 offsets.
 * Values are appended in row order ({@link #put}, {@link #putNull}), one array copy each; this is what
 * {@code OnHeapColumnVector.putByteArray} does through several calls per value, and the scan makes
 * about ten such writes per record.
 */
final class BytesColumn extends ColumnVector {
  private byte[] data = new byte[1 << 16];
  private int[] offsets;
  private boolean[] nulls;
  private int size;
  private int count;
  private int numNulls;

  BytesColumn(DataType type, int rows) {
    super(type);
    offsets = new int[rows + 1];
    nulls = new boolean[rows];
  }

  void reset() {
    size = 0;
    count = 0;
    if (numNulls > 0) {
      Arrays.fill(nulls, false);
      numNulls = 0;
    }
  }

  /** Number of values appended since {@link #reset}. */
  int count() {
    return count;
  }

  void put(byte[] src, int off, int len) {
    if (size + len > data.length) {
      data = Arrays.copyOf(data, Math.max(size + len, data.length * 2));
    }
    System.arraycopy(src, off, data, size, len);
    size += len;
    next();
  }

  void putNull() {
    if (count >= nulls.length) {
      nulls = Arrays.copyOf(nulls, nulls.length * 2);
    }
    nulls[count] = true;
    numNulls++;
    next();
  }

  private void next() {
    count++;
    if (count >= offsets.length) {
      offsets = Arrays.copyOf(offsets, offsets.length * 2);
      nulls = Arrays.copyOf(nulls, offsets.length);
    }
    offsets[count] = size;
  }

  @Override
  public boolean isNullAt(int rowId) {
    return nulls[rowId];
  }

  @Override
  public UTF8String getUTF8String(int rowId) {
    int o = offsets[rowId];
    return UTF8String.fromBytes(data, o, offsets[rowId + 1] - o);
  }

  @Override
  public byte[] getBinary(int rowId) {
    return Arrays.copyOfRange(data, offsets[rowId], offsets[rowId + 1]);
  }

  @Override
  public boolean hasNull() {
    return numNulls > 0;
  }

  @Override
  public int numNulls() {
    return numNulls;
  }

  @Override
  public void close() {
  }

  @Override
  public boolean getBoolean(int rowId) {
    throw unsupported();
  }

  @Override
  public byte getByte(int rowId) {
    throw unsupported();
  }

  @Override
  public short getShort(int rowId) {
    throw unsupported();
  }

  @Override
  public int getInt(int rowId) {
    throw unsupported();
  }

  @Override
  public long getLong(int rowId) {
    throw unsupported();
  }

  @Override
  public float getFloat(int rowId) {
    throw unsupported();
  }

  @Override
  public double getDouble(int rowId) {
    throw unsupported();
  }

  @Override
  public ColumnarArray getArray(int rowId) {
    throw unsupported();
  }

  @Override
  public ColumnarMap getMap(int ordinal) {
    throw unsupported();
  }

  @Override
  public Decimal getDecimal(int rowId, int precision, int scale) {
    throw unsupported();
  }

  @Override
  public ColumnVector getChild(int ordinal) {
    throw unsupported();
  }

  private UnsupportedOperationException unsupported() {
    return new UnsupportedOperationException("a " + dataType().simpleString() + " column");
  }

  /** The {@code map<string,string>} column: per row a run of entries of the key and value columns. */
  static final class MapColumn extends ColumnVector {
    final BytesColumn keys;
    final BytesColumn values;
    private final int[] offsets;

    MapColumn(DataType type, int rows) {
      super(type);
      keys = new BytesColumn(org.apache.spark.sql.types.DataTypes.StringType, rows * 4);
      values = new BytesColumn(org.apache.spark.sql.types.DataTypes.StringType, rows * 4);
      offsets = new int[rows + 1];
    }

    void reset() {
      keys.reset();
      values.reset();
    }

    /** Ends row {@code rowId}: its entries are those appended to keys/values since the previous row. */
    void endRow(int rowId) {
      offsets[rowId + 1] = keys.count();
    }

    @Override
    public ColumnarMap getMap(int rowId) {
      int o = offsets[rowId];
      return new ColumnarMap(keys, values, o, offsets[rowId + 1] - o);
    }

    @Override
    public boolean isNullAt(int rowId) {
      return false;
    }

    @Override
    public boolean hasNull() {
      return false;
    }

    @Override
    public int numNulls() {
      return 0;
    }

    @Override
    public ColumnVector getChild(int ordinal) {
      return ordinal == 0 ? keys : values;
    }

    @Override
    public void close() {
    }

    @Override
    public boolean getBoolean(int rowId) {
      throw keys.unsupported();
    }

    @Override
    public byte getByte(int rowId) {
      throw keys.unsupported();
    }

    @Override
    public short getShort(int rowId) {
      throw keys.unsupported();
    }

    @Override
    public int getInt(int rowId) {
      throw keys.unsupported();
    }

    @Override
    public long getLong(int rowId) {
      throw keys.unsupported();
    }

    @Override
    public float getFloat(int rowId) {
      throw keys.unsupported();
    }

    @Override
    public double getDouble(int rowId) {
      throw keys.unsupported();
    }

    @Override
    public ColumnarArray getArray(int rowId) {
      throw keys.unsupported();
    }

    @Override
    public Decimal getDecimal(int rowId, int precision, int scale) {
      throw keys.unsupported();
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
      throw keys.unsupported();
    }

    @Override
    public byte[] getBinary(int rowId) {
      throw keys.unsupported();
    }
  }
}
