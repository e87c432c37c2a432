package rmqeventstore.spark;

import java.io.File;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.EnumSet;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * {@code spark.read.format("rocketmq-jvm").load(STORE_PATH)}: the batch full scan of a RocketMQ-format
 * store as a DataSource V2 source in the JVM, with the schema and values of the Python source
 * ({@code rmq_eventstore/spark/decode.py} is the definition), read as columnar batches so that no Python
 * worker and no Arrow-to-row conversion is involved.
 *
 * <p>Partitions are planned as {@code source.plan_scan} does: one per commitlog segment, cut into
 * {@code splitSize} byte ranges; a range that does not start the file re-synchronises on its first
 * record ({@code decode.resync}). Options: {@code path}, {@code splitSize}, {@code verifyCrc},
 * {@code commitLogFileSize}, {@code topics}/{@code topic} (a filter over a commitlog scan; with a store
 * root that has consume queues only together with {@code useConsumeQueue=false}, as the Python source
 * would read the consume queues), {@code useConsumeQueue}. Any other option fails the read naming it.
 */
public final class RocketMQJvmSource implements TableProvider, DataSourceRegister {
  public static final String SHORT_NAME = "rocketmq-jvm";
  static final long DEFAULT_SPLIT = 16L << 20;  // the Python source's is 64 MiB: JVM tasks start cheaply

  static final StructType SCHEMA = new StructType(new StructField[] {
      field("topic", DataTypes.StringType), field("queue_id", DataTypes.IntegerType),
      field("queue_offset", DataTypes.LongType), field("commit_log_offset", DataTypes.LongType),
      field("store_size", DataTypes.IntegerType), field("sys_flag", DataTypes.IntegerType),
      field("flag", DataTypes.IntegerType), field("born_timestamp", DataTypes.TimestampType),
      field("born_host", DataTypes.StringType), field("store_timestamp", DataTypes.TimestampType),
      field("store_host", DataTypes.StringType), field("reconsume_times", DataTypes.IntegerType),
      field("prepared_transaction_offset", DataTypes.LongType), field("tags", DataTypes.StringType),
      field("keys", DataTypes.StringType), field("uniq_key", DataTypes.StringType),
      field("properties", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, true)),
      field("body", DataTypes.BinaryType), field("msg_id", DataTypes.StringType),
  });

  /** Options this reader implements (lower case); the Python source's others are refused by name. */
  private static final Set<String> SUPPORTED = Set.of(
      "path", "splitsize", "verifycrc", "commitlogfilesize", "topics", "topic", "useconsumequeue");

  private static StructField field(String name, org.apache.spark.sql.types.DataType type) {
    return new StructField(name, type, true, org.apache.spark.sql.types.Metadata.empty());
  }

  @Override
  public String shortName() {
    return SHORT_NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    Options.parse(options);  // fail at load() on a bad path or option, as the Python source does
    return SCHEMA;
  }

  @Override
  public boolean supportsExternalMetadata() {
    return false;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new RocketMQTable(Options.parse(new CaseInsensitiveStringMap(properties)));
  }

  /** A bad path or option given to the {@code rocketmq-jvm} source. */
  public static final class SourceError extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    SourceError(String message) {
      super(message);
    }
  }

  /** The parsed options of one read (what every task needs travels in the partitions and factory). */
  static final class Options implements Serializable {
    private static final long serialVersionUID = 1L;
    String path;
    long split = DEFAULT_SPLIT;
    boolean verifyCrc;
    Long fileSize;
    List<String> topics;  // null: no topic filter
    boolean useConsumeQueue = true;

    static Options parse(CaseInsensitiveStringMap options) {
      Options o = new Options();
      List<String> unsupported = new ArrayList<>();
      for (String k : options.keySet()) {
        if (!SUPPORTED.contains(k.toLowerCase(Locale.ROOT))) {
          unsupported.add(k);
        }
      }
      if (!unsupported.isEmpty()) {
        Collections.sort(unsupported);
        throw new SourceError("option " + String.join(", ", unsupported) + " is not supported by the "
            + SHORT_NAME + " reader (it reads: path, splitSize, verifyCrc, commitLogFileSize, topics with "
            + "useConsumeQueue=false); use format(\"rocketmq\") for it");
      }
      o.path = options.get("path");
      if (o.path == null || o.path.isEmpty()) {
        throw new SourceError("the " + SHORT_NAME + " source needs a store path: spark.read.format(\""
            + SHORT_NAME + "\").load(PATH)");
      }
      Long split = longOption(options, "splitSize");
      if (split != null) {
        if (split <= 0) {
          throw new SourceError("option splitSize must be positive");
        }
        o.split = split;
      }
      o.verifyCrc = boolOption(options, "verifyCrc", false);
      o.fileSize = longOption(options, "commitLogFileSize");
      o.useConsumeQueue = boolOption(options, "useConsumeQueue", true);
      for (String name : new String[] {"topics", "topic"}) {
        String v = options.get(name);
        if (v != null && !v.isEmpty()) {
          List<String> t = new ArrayList<>();
          for (String s : v.split(",", -1)) {
            String st = s.strip();
            if (!st.isEmpty()) {
              t.add(st);
            }
          }
          o.topics = t;
          break;
        }
      }
      File[] dirs = commitLogDir(o.path);
      if (o.topics != null && o.useConsumeQueue && dirs[1] != null
          && new File(dirs[1], "consumequeue").isDirectory()) {
        throw new SourceError("option topics on a store with consume queues: the " + SHORT_NAME
            + " reader scans the commitlog only; add useConsumeQueue=false (every record of the topics, "
            + "dispatched or not) or use format(\"rocketmq\") (reads the consume queues)");
      }
      return o;
    }

    private static Long longOption(CaseInsensitiveStringMap options, String name) {
      String v = options.get(name);
      if (v == null || v.isEmpty()) {
        return null;
      }
      try {
        return Long.parseLong(v.strip());
      } catch (NumberFormatException e) {
        throw new SourceError("option " + name + "='" + v + "': expected an integer");
      }
    }

    private static boolean boolOption(CaseInsensitiveStringMap options, String name, boolean dflt) {
      String v = options.get(name);
      if (v == null) {
        return dflt;
      }
      String s = v.toLowerCase(Locale.ROOT);
      if (s.equals("true") || s.equals("1") || s.equals("yes") || s.equals("on")) {
        return true;
      }
      if (s.equals("false") || s.equals("0") || s.equals("no") || s.equals("off")) {
        return false;
      }
      throw new SourceError("option " + name + "='" + v + "': expected true or false");
    }
  }

  /** (commitlog directory, store root or null) of a store root or a bare commitlog directory. */
  static File[] commitLogDir(String path) {
    File p = new File(path);
    if (!p.isDirectory()) {
      throw new SourceError("no store directory at '" + path + "'");
    }
    File cl = new File(p, "commitlog");
    if (cl.isDirectory()) {
      return new File[] {cl, p};
    }
    String[] names = p.list();
    if (names != null) {
      for (String n : names) {
        if (n.length() >= 20 && isDigits(n)) {
          return new File[] {p, null};
        }
      }
    }
    throw new SourceError("'" + path + "' holds neither a commitlog/ directory nor commitlog segment files");
  }

  static boolean isDigits(String s) {
    if (s.isEmpty()) {
      return false;
    }
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c < '0' || c > '9') {
        return false;
      }
    }
    return true;
  }

  /** Byte-range partitions over the commitlog segments ({@code source.plan_scan} without filters). */
  static List<SegmentRange> planScan(Options o) {
    File dir = commitLogDir(o.path)[0];
    String[] names = dir.list();
    List<String> segs = new ArrayList<>();
    if (names != null) {
      for (String n : names) {
        if (isDigits(n)) {
          segs.add(n);
        }
      }
    }
    segs.sort((a, b) -> new java.math.BigInteger(a).compareTo(new java.math.BigInteger(b)));
    long[] starts = new long[segs.size()];
    long[] onDisk = new long[segs.size()];
    for (int i = 0; i < segs.size(); i++) {
      starts[i] = Long.parseLong(segs.get(i));
      onDisk[i] = new File(dir, segs.get(i)).length();
    }
    long size;
    if (o.fileSize != null) {
      size = o.fileSize;
    } else if (segs.size() >= 2 && starts[1] > starts[0]) {
      size = starts[1] - starts[0];
    } else {
      size = segs.isEmpty() || onDisk[0] == 0 ? 1L << 30 : onDisk[0];
    }
    List<SegmentRange> out = new ArrayList<>();
    for (int i = 0; i < segs.size(); i++) {
      long hi = Math.min(onDisk[i], size);
      if (hi <= 0) {
        continue;
      }
      String path = new File(dir, segs.get(i)).getPath();
      for (long pos = 0; pos < hi; ) {
        long end = Math.min(hi, pos + o.split);
        out.add(new SegmentRange(path, starts[i], pos, end, pos == 0));
        pos = end;
      }
    }
    return out;
  }

  /** Records of one commitlog segment that start in [lo, hi) (positions in the file). */
  static final class SegmentRange implements InputPartition {
    private static final long serialVersionUID = 1L;
    final String path;
    final long fileFrom;
    final long lo;
    final long hi;
    final boolean exactStart;  // lo is a record start (else re-synchronise on the first record >= lo)

    SegmentRange(String path, long fileFrom, long lo, long hi, boolean exactStart) {
      this.path = path;
      this.fileFrom = fileFrom;
      this.lo = lo;
      this.hi = hi;
      this.exactStart = exactStart;
    }
  }

  static final class RocketMQTable implements Table, SupportsRead {
    private final Options options;

    RocketMQTable(Options options) {
      this.options = options;
    }

    @Override
    public String name() {
      return SHORT_NAME + ":" + options.path;
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap scanOptions) {
      return new RocketMQScanBuilder(options);
    }
  }

  /** Takes Spark's column pruning: only the columns a query uses are decoded. */
  static final class RocketMQScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns {
    private final Options options;
    private StructType schema = SCHEMA;

    RocketMQScanBuilder(Options options) {
      this.options = options;
    }

    @Override
    public void pruneColumns(StructType required) {
      List<StructField> keep = new ArrayList<>();
      for (StructField f : SCHEMA.fields()) {
        if (required.getFieldIndex(f.name()).isDefined()) {
          keep.add(f);
        }
      }
      schema = new StructType(keep.toArray(new StructField[0]));
    }

    @Override
    public Scan build() {
      return new RocketMQScan(options, schema);
    }
  }

  static final class RocketMQScan implements Scan, Batch {
    private final Options options;
    private final StructType schema;

    RocketMQScan(Options options, StructType schema) {
      this.options = options;
      this.schema = schema;
    }

    @Override
    public StructType readSchema() {
      return schema;
    }

    @Override
    public String description() {
      return SHORT_NAME + " [" + options.path + "]";
    }

    @Override
    public Batch toBatch() {
      return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
      return planScan(options).toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new ReaderFactory(options, schema.fieldNames());
    }
  }

  static final class ReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final boolean verifyCrc;
    private final Long fileSize;
    private final byte[][] topics;
    private final String[] columns;

    ReaderFactory(Options o, String[] columns) {
      this.columns = columns;
      verifyCrc = o.verifyCrc;
      fileSize = o.fileSize;
      if (o.topics == null) {
        topics = null;
      } else {
        Set<String> uniq = new LinkedHashSet<>(o.topics);
        topics = new byte[uniq.size()][];
        int i = 0;
        for (String t : uniq) {
          topics[i++] = t.getBytes(StandardCharsets.UTF_8);
        }
        Arrays.sort(topics, Arrays::compare);
      }
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      return new SegmentReader((SegmentRange) partition, fileSize, verifyCrc, topics, columns);
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException(SHORT_NAME + " reads columnar batches only");
    }
  }
}
