package tidemark.iceberg;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.reflect.Field;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.AppendFiles;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DataFiles;
import org.apache.iceberg.ExpireSnapshots;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.GenericManifestFile;
import org.apache.iceberg.Metrics;
import org.apache.iceberg.MetricsConfig;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.SchemaParser;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SortOrder;
import org.apache.iceberg.LocationProviders;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestWriter;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.TableMetadataParser;
import org.apache.iceberg.TableOperations;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.Transaction;
import org.apache.iceberg.Transactions;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.LocationProvider;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.mapping.MappingUtil;
import org.apache.iceberg.mapping.NameMapping;
import org.apache.iceberg.mapping.NameMappingParser;
import org.apache.iceberg.parquet.ParquetUtil;
import org.apache.iceberg.util.JsonUtil;
import org.apache.iceberg.util.PropertyUtil;
import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.core.config.Configurator;
import org.apache.iceberg.relocated.com.google.common.util.concurrent.MoreExecutors;
import org.apache.parquet.ParquetReadOptions;
import org.apache.parquet.conf.PlainParquetConfiguration;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.io.LocalInputFile;

/**
 * The stream commits of tidemark's Iceberg changelogs, made with Iceberg's Java library in
 * Spark's driver (called from Python: tidemark/sink/iceberg/jvm.py): the same commit as
 * tidemark.sink.iceberg.table.IcebergChangelog.commit makes through pyiceberg, with the same
 * checks, so the two write one table in turn.
 *
 * <p>The catalog stays Python's: a commit here writes the new snapshot's manifest, manifest
 * list and table metadata file, and Python swaps the catalog's pointer to that file (the same
 * compare-and-swap pyiceberg's SQL catalog makes, on the same connections) and reports back
 * ({@link #swapped}). A commit reads the table's metadata at the pointer Python gives (cached
 * from the last commit here while the pointer has not moved), checks its newest snapshot (the
 * leader's epoch mark, the replay check on the stream's committed offset), and builds one
 * snapshot appending the files on exactly that metadata: {@link Ops} never reads anything
 * again, where Iceberg's own table operations would refresh and apply the append again on a
 * newer snapshot, unchecked. A pointer that moved in between (pyiceberg's commit, a newer
 * leader's mark) makes Python's swap fail; the table is read again and checked again.
 *
 * <p>The files it writes go through {@link SyncedFileIO}: fenced and synced before Python
 * moves the pointer to them.
 */
public final class IcebergStreamCommits {
  private final SyncedFileIO io = new SyncedFileIO();
  private final Map<String, Ops> tables = new ConcurrentHashMap<>();

  public IcebergStreamCommits(Map<String, String> properties, Configuration conf) {
    io.setConf(conf);
    io.initialize(properties);
    MetadataAvro.install();
    // after each commit Iceberg's transaction looks for the new snapshot in the table's
    // current metadata, to remove files its retries left; here that metadata moves only when
    // Python has swapped the pointer (and a commit here is never retried), so it found none
    // and logged a warning at every commit
    Configurator.setLevel("org.apache.iceberg.BaseTransaction", Level.ERROR);
  }

  /**
   * Build the commit appending {@code paths} (Parquet files: URIs, or paths relative to the
   * table's folder) to {@code name} (namespace.table), whose catalog pointer is {@code
   * location}, in one snapshot whose summary is the carried keys of the newest snapshot (those
   * starting with one of {@code carried}), then {@code extra}, then {@code mark}; write its
   * files. {@code request} is a JSON object with those four: {@code paths} and {@code carried}
   * lists of strings, {@code extra} and {@code mark} objects of strings; and for a backfill's
   * commit {@code backfill}, the generation's key: the commit is made whatever other writers or
   * the stream committed (no {@code others}, {@code skip} or {@code overlap}), and its summary's
   * generation is one past the newest snapshot's (tidemark.sink.iceberg.table's
   * backfill_commit when it removes no file).
   *
   * <p>The table's state is the summary of tidemark's newest snapshot, read past other writers'
   * snapshots after it (a snapshot is tidemark's when a key of its summary starts with {@code
   * tidemark}), as tidemark.sink.iceberg.snapshots reads it.
   *
   * <p>Returns {@code "<outcome> <number>"}, the outcome one of (checked in this order): {@code
   * deposed} (a newer leader marked the table: the number is the mark, {@code epochKey}'s value,
   * above {@code epoch}, which is -1 when unfenced), {@code others} (other writers changed the
   * table beyond appends: {@code "others <what> <snapshot id> <tidemark's newest snapshot id or
   * ->"}, what as snapshots.others_change says it), {@code skip} (the table holds the batch: the
   * number is the committed offset, at or above {@code end}), {@code overlap} (it holds a part
   * of it: the offset), {@code swap} ({@code "swap <number> <location>"}: the commit's files are
   * written, the number is its sequence number, the location its metadata file, for Python to
   * swap the pointer to and report with {@link #swapped}).
   */
  public String append(
      String name,
      String location,
      String request,
      long first,
      long end,
      String offsetKey,
      String epochKey,
      long epoch,
      String leaderFile,
      boolean sync) {
    SyncedFileIO.Fence.set(leaderFile, epoch, sync);
    try {
      // (one JSON string from Python, not py4j's conversion: a gateway call per element)
      JsonNode asked = JsonUtil.mapper().readTree(request);
      List<String> paths = strings(asked.get("paths"));
      List<String> carriedPrefixes = strings(asked.get("carried"));
      Map<String, String> extra = JsonUtil.getStringMap("extra", asked);
      Map<String, String> mark = JsonUtil.getStringMap("mark", asked);
      // a backfill's commit: built on whatever the table holds (it replaces every row), its
      // generation one past the newest snapshot's
      String generationKey = asked.hasNonNull("backfill") ? asked.get("backfill").asText() : null;
      Ops ops = tables.get(name);
      if (ops == null || !location.equals(ops.current.metadataFileLocation())) {
        ops = new Ops(io, TableMetadataParser.read(io, location));
        tables.put(name, ops);
      }
      TableMetadata base = ops.current;
      List<Snapshot> others = new ArrayList<>();
      Snapshot newest = own(base, others);
      Map<String, String> found = newest == null ? Map.of() : newest.summary();
      Long marked = number(found, epochKey);
      if (epoch >= 0 && marked != null && marked > epoch) {
        return "deposed " + marked;
      }
      if (generationKey != null) {
        Long generation = number(found, generationKey);
        extra = new LinkedHashMap<>(extra);
        extra.put(generationKey, String.valueOf(generation == null ? 1 : generation + 1));
      } else {
        String refused = othersChange(base, newest, others);
        if (refused != null) {
          return "others " + refused + " " + (newest == null ? "-" : newest.snapshotId());
        }
        Long offset = number(found, offsetKey);
        if (offset != null && end <= offset) {
          return "skip " + offset;
        }
        if (offset != null && first <= offset) {
          return "overlap " + offset;
        }
      }
      Transaction tx = Transactions.newTransaction(name, ops);
      Ops.WRITTEN.remove();
      Listed listed = commit(tx, ops, paths, summary(found, carriedPrefixes, extra, mark));
      String written = Ops.WRITTEN.get();
      TableMetadata pending = written == null ? null : ops.pending.get(written);
      if (pending == null) {
        throw new IllegalStateException("the commit of " + name + " wrote no table metadata");
      }
      if (listed != null) {
        listed.fill(pending.currentSnapshot());
      }
      return "swap " + pending.currentSnapshot().sequenceNumber() + " " + pending.metadataFileLocation();
    } catch (IOException unreadable) {
      throw new UncheckedIOException(unreadable);
    } catch (RuntimeException failed) {
      tables.remove(name);
      throw failed;
    } finally {
      SyncedFileIO.Fence.clear();
    }
  }

  /**
   * Write the first metadata of a new table {@code name} at {@code location}: the schema
   * {@code schemaJson} (Iceberg's JSON), no partitions, the table properties of {@code
   * request}'s {@code properties} (its {@code format-version} among them) and Iceberg's default
   * name mapping of the schema, and one empty snapshot whose summary is {@code request}'s {@code
   * summary} (born marked, as tidemark.sink.iceberg.table's create makes it through pyiceberg).
   * Returns the metadata file's location, for Python to insert into the catalog and report with
   * {@link #swapped} (not inserted: the file is removed).
   */
  public String create(
      String name,
      String location,
      String schemaJson,
      String request,
      String leaderFile,
      long epoch,
      boolean sync) {
    SyncedFileIO.Fence.set(leaderFile, epoch, sync);
    try {
      JsonNode asked = JsonUtil.mapper().readTree(request);
      Map<String, String> properties = JsonUtil.getStringMap("properties", asked);
      Map<String, String> summary = JsonUtil.getStringMap("summary", asked);
      TableMetadata fresh =
          TableMetadata.newTableMetadata(
              SchemaParser.fromJson(schemaJson),
              PartitionSpec.unpartitioned(),
              SortOrder.unsorted(),
              location,
              properties);
      TableMetadata metadata =
          TableMetadata.buildFrom(fresh)
              .setProperties(
                  Map.of(
                      TableProperties.DEFAULT_NAME_MAPPING,
                      NameMappingParser.toJson(MappingUtil.create(fresh.schema()))))
              .build();
      Ops ops = new Ops(io, null);
      ops.creating = metadata;
      Transaction tx = Transactions.createTableTransaction(name, ops, metadata);
      AppendFiles born = tx.newFastAppend();
      summary.forEach(born::set);
      born.commit();
      Ops.WRITTEN.remove();
      tx.commitTransaction();
      String written = Ops.WRITTEN.get();
      if (written == null || !ops.pending.containsKey(written)) {
        throw new IllegalStateException("the creation of " + name + " wrote no table metadata");
      }
      Snapshot first = ops.pending.get(written).currentSnapshot();
      if (first != null && metadata.formatVersion() == 2) {
        new Listed(first, null, List.of()).fill(first); // (it lists no manifest)
      }
      tables.put(name, ops);
      return written;
    } catch (IOException unreadable) {
      throw new UncheckedIOException(unreadable);
    } catch (RuntimeException failed) {
      tables.remove(name);
      throw failed;
    } finally {
      SyncedFileIO.Fence.clear();
    }
  }

  /**
   * Tidemark's newest snapshot of {@code metadata} (null if none is left), walking back over
   * other writers' snapshots, which go into {@code others}, newest first.
   */
  static Snapshot own(TableMetadata metadata, List<Snapshot> others) {
    Snapshot snap = metadata.currentSnapshot();
    while (snap != null && !isOwn(snap)) {
      others.add(snap);
      snap = snap.parentId() == null ? null : metadata.snapshot(snap.parentId());
    }
    return snap;
  }

  private static boolean isOwn(Snapshot snap) {
    return snap.summary().keySet().stream().anyMatch(k -> k.startsWith("tidemark"));
  }

  /**
   * snapshots.others_change: {@code "<what> <snapshot id>"} when other writers changed the table
   * beyond appends since {@code own} (an operation other than append, the oldest first; {@code
   * history}: no snapshot of tidemark's is left; {@code schema}: the schema is not the one
   * {@code own} was written with), else null.
   */
  static String othersChange(TableMetadata metadata, Snapshot own, List<Snapshot> others) {
    for (int k = others.size() - 1; k >= 0; k--) {
      Snapshot s = others.get(k);
      if (!"append".equals(s.operation())) {
        return s.operation() + " " + s.snapshotId();
      }
    }
    if (!others.isEmpty() && own == null) {
      return "history " + others.get(others.size() - 1).snapshotId();
    }
    if (own != null && own.schemaId() != null && own.schemaId() != metadata.currentSchemaId()) {
      return "schema " + own.snapshotId();
    }
    return null;
  }

  private static List<String> strings(JsonNode array) {
    List<String> out = new ArrayList<>();
    array.forEach(item -> out.add(item.asText()));
    return out;
  }

  /**
   * Python's swap of the catalog's pointer to the metadata file {@code written} that {@link
   * #append} wrote: {@code ok}, the table is at that metadata now (and the metadata files it no
   * longer keeps are removed); else the file is removed and the table is read again at the next
   * commit. (Two commits built on one metadata, from two threads: the catalog's swap lets one
   * through, so each is matched by its own file.)
   */
  public void swapped(String name, String written, boolean ok, String leaderFile, long epoch) {
    Ops ops = tables.get(name);
    TableMetadata pending = ops == null ? null : ops.pending.remove(written);
    SyncedFileIO.Fence.set(leaderFile, epoch, true);
    try {
      if (ok && pending != null) {
        TableMetadata base = ops.current;
        ops.current = pending;
        ops.creating = null;
        if (base != null) {
          CatalogUtil.deleteRemovedMetadataFiles(io, base, pending);
        }
      } else if (!ok) {
        tables.remove(name);
        io.deleteFile(written);
        if (pending != null) {
          removeUnswapped(ops.current, pending);
        }
      } else {
        tables.remove(name); // (read again at the next commit)
      }
    } finally {
      SyncedFileIO.Fence.clear();
    }
  }

  /**
   * The files of the snapshot {@code pending}'s commit added (its current one: an append's new
   * snapshot, a new table's first), when the catalog never named {@code pending}: its manifest
   * list and the manifests it wrote. (Only that snapshot's: the others {@code pending} holds are
   * its base's, which the table may still name, or may have expired since.)
   */
  private void removeUnswapped(TableMetadata current, TableMetadata pending) {
    Snapshot added = pending.currentSnapshot();
    if (added == null || (current != null && current.snapshot(added.snapshotId()) != null)) {
      return;
    }
    for (ManifestFile manifest : added.allManifests(io)) {
      if (manifest.snapshotId() != null && manifest.snapshotId() == added.snapshotId()) {
        io.deleteFile(manifest.path());
      }
    }
    io.deleteFile(added.manifestListLocation());
  }

  /** Forget the table as read (another writer changed it: pyiceberg, a set-aside). */
  public void forget(String name) {
    tables.remove(name);
  }

  public void close() {
    tables.clear();
    io.close();
  }

  /**
   * Make the commit of {@code paths} in {@code tx}: a fast append (the new manifest, then the
   * parent snapshot's manifests as they are) while the parent lists fewer manifests than the
   * table's {@code commit.manifest.min-count-to-merge} (less one), else Iceberg's merge append,
   * which merges them as its properties say. Returns what a fast append's snapshot lists (for
   * {@link Listed#fill}), else null.
   */
  private static Listed commit(
      Transaction tx, Ops ops, List<String> paths, Map<String, String> summary) {
    Table table = tx.table();
    MetricsConfig metrics = MetricsConfig.forTable(table);
    String mappingJson = table.properties().get(TableProperties.DEFAULT_NAME_MAPPING);
    NameMapping mapping = mappingJson == null ? null : NameMappingParser.fromJson(mappingJson);
    int version = ops.current().formatVersion();
    Snapshot parent = table.currentSnapshot();
    List<ManifestFile> parentListed = parent == null ? List.of() : parent.allManifests(table.io());
    boolean fast = version == 2 && parentListed.size() + 1 < mergeCount(table);
    AppendFiles append =
        fast ? tx.newFastAppend() : tx.newAppend().scanManifestsWith(IN_THIS_THREAD);
    String location = table.location().replaceAll("/+$", "");
    List<DataFile> added = new ArrayList<>();
    for (String name : paths) {
      String path = name.contains("://") || name.startsWith("/") ? name : location + "/" + name;
      java.nio.file.Path local = SyncedFileIO.localPath(path);
      DataFiles.Builder data =
          DataFiles.builder(table.spec()).withPath(path).withFormat(FileFormat.PARQUET);
      if (local != null) {
        data.withFileSizeInBytes(local.toFile().length())
            .withMetrics(localMetrics(local, metrics, mapping));
      } else {
        InputFile file = table.io().newInputFile(path);
        data.withFileSizeInBytes(file.getLength())
            .withMetrics(ParquetUtil.fileMetrics(file, metrics, mapping));
      }
      added.add(data.build());
    }
    ManifestFile ours = null;
    if (version >= 2 && !added.isEmpty()) {
      // the manifest written here, on this thread: Iceberg writes an appended file's manifest
      // on its worker pool and polls for it every 10 ms (Tasks.waitFor), which was most of a
      // commit's time. (From format 2 on a manifest's entries take the commit's snapshot id
      // and sequence number when it lands, so it is used as it is.)
      ManifestWriter<DataFile> writer =
          ManifestFiles.write(
              version,
              table.spec(),
              table.io().newOutputFile(ops.metadataFileLocation(UUID.randomUUID() + "-m0.avro")),
              null);
      try (writer) {
        added.forEach(writer::add);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      ours = writer.toManifestFile();
      append.appendManifest(ours);
    } else {
      added.forEach(append::appendFile);
    }
    summary.forEach(append::set);
    append.commit();
    // a table keeps at most tidemark.max-snapshots snapshots: this commit removes the oldest
    // past that (their files go at the next vacuum), as the pyiceberg commit does
    int keep = Integer.parseInt(table.properties().getOrDefault("tidemark.max-snapshots", "100"));
    List<Snapshot> old = new ArrayList<>();
    Snapshot current = null;
    // (the snapshots before this commit: the one just appended is the transaction's current)
    Snapshot appended = table.currentSnapshot();
    Listed listed = fast && appended != null ? new Listed(appended, ours, parentListed) : null;
    for (Snapshot s : table.snapshots()) {
      if (appended == null || s.snapshotId() != appended.snapshotId()) {
        old.add(s);
      }
    }
    if (appended != null && appended.parentId() != null) {
      current = table.snapshot(appended.parentId());
    }
    if (old.size() >= keep) {
      old.sort(Comparator.comparingLong(Snapshot::timestampMillis));
      ExpireSnapshots expire =
          tx.expireSnapshots()
              .expireOlderThan(0)
              .cleanExpiredFiles(false)
              .planWith(IN_THIS_THREAD);
      int removed = 0;
      for (Snapshot s : old.subList(0, old.size() - keep + 1)) {
        if (current == null || s.snapshotId() != current.snapshotId()) {
          expire.expireSnapshotId(s.snapshotId());
          removed++;
        }
      }
      if (removed > 0) {
        expire.commit();
      }
    }
    tx.commitTransaction();
    return listed;
  }

  /** How many manifests Iceberg's merge append merges at once (off: never). */
  private static int mergeCount(Table table) {
    Map<String, String> properties = table.properties();
    if (!PropertyUtil.propertyAsBoolean(
        properties,
        TableProperties.MANIFEST_MERGE_ENABLED,
        TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT)) {
      return Integer.MAX_VALUE;
    }
    return PropertyUtil.propertyAsInt(
        properties,
        TableProperties.MANIFEST_MIN_MERGE_COUNT,
        TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT);
  }

  /**
   * The manifests a fast append's new snapshot lists, as its manifest list file has them
   * (format 2): the appended manifest with the snapshot's id, its unassigned sequence numbers
   * the snapshot's (as the list's writer writes them), then the parent's. {@link #fill} hands
   * them to the snapshot, so that the next commit on it, which lists them again, does not read
   * the file back (Iceberg reads a snapshot's list once per snapshot object, and the snapshot
   * an append makes has none: every commit read its parent's list, about a fifth of its JVM
   * time at 1000 shapes).
   */
  static final class Listed {
    // BaseSnapshot's list read from its manifest list file (null until read): set here
    private static final Field ALL_MANIFESTS = allManifestsField();
    // a manifest's sequence numbers before its commit assigns them (ManifestWriter's)
    private static final long UNASSIGNED_SEQ = -1;
    private final long snapshotId;
    private final List<ManifestFile> manifests;

    Listed(Snapshot snapshot, ManifestFile appended, List<ManifestFile> parent) {
      this.snapshotId = snapshot.snapshotId();
      this.manifests = new HandedOn(parent.size() + 1);
      if (appended != null) {
        GenericManifestFile listed =
            (GenericManifestFile)
                GenericManifestFile.copyOf(appended).withSnapshotId(snapshotId).build();
        long sequence = snapshot.sequenceNumber();
        if (listed.sequenceNumber() == UNASSIGNED_SEQ) {
          listed.set(4, sequence); // (ManifestFile.SEQUENCE_NUMBER's position)
        }
        if (listed.minSequenceNumber() == UNASSIGNED_SEQ) {
          listed.set(5, sequence); // (ManifestFile.MIN_SEQUENCE_NUMBER's)
        }
        manifests.add(listed);
      }
      manifests.addAll(parent);
    }

    /** Give {@code snapshot} (the committed one, as the metadata written holds it) the list. */
    void fill(Snapshot snapshot) {
      if (ALL_MANIFESTS == null
          || snapshot == null
          || snapshot.snapshotId() != snapshotId
          || !ALL_MANIFESTS.getDeclaringClass().isInstance(snapshot)) {
        return; // (read from the file when asked, as before)
      }
      try {
        if (ALL_MANIFESTS.get(snapshot) == null) {
          ALL_MANIFESTS.set(snapshot, manifests);
        }
      } catch (IllegalAccessException unexpected) {
        // (left unset: read from the file)
      }
    }

    /**
     * Whether {@code snapshot} holds its list: {@code "filled"} (by {@link #fill}), {@code
     * "read"} (from its file: a merge append reads its new snapshot's list back) or {@code
     * "unread"}.
     */
    static String held(Snapshot snapshot) {
      try {
        Object list =
            ALL_MANIFESTS != null && ALL_MANIFESTS.getDeclaringClass().isInstance(snapshot)
                ? ALL_MANIFESTS.get(snapshot)
                : null;
        return list instanceof HandedOn ? "filled" : list != null ? "read" : "unread";
      } catch (IllegalAccessException unexpected) {
        return "unread";
      }
    }

    /** A list {@link #fill} gave (its type tells {@link #held} so). */
    private static final class HandedOn extends ArrayList<ManifestFile> {
      HandedOn(int size) {
        super(size);
      }
    }

    private static Field allManifestsField() {
      try {
        Field field = Class.forName("org.apache.iceberg.BaseSnapshot").getDeclaredField("allManifests");
        field.setAccessible(true);
        return field;
      } catch (ReflectiveOperationException | RuntimeException absent) {
        return null; // (another Iceberg: every list read from its file)
      }
    }
  }

  /**
   * For checks: the current snapshot of {@code name} as this JVM holds it, one line per manifest
   * it lists with every field of the manifest list's entries, first as held here, then as its
   * manifest list file has them; the first line is what {@link Listed#held} said before.
   */
  public String listedManifests(String name) {
    Ops ops = tables.get(name);
    Snapshot snapshot = ops == null || ops.current == null ? null : ops.current.currentSnapshot();
    if (snapshot == null) {
      return "none";
    }
    StringBuilder out = new StringBuilder(Listed.held(snapshot));
    out.append("\n").append(described(snapshot.allManifests(io)));
    out.append("--\n");
    Snapshot fromFile =
        TableMetadataParser.read(io, ops.current.metadataFileLocation())
            .snapshot(snapshot.snapshotId());
    out.append(described(fromFile.allManifests(io)));
    return out.toString();
  }

  private static String described(List<ManifestFile> manifests) {
    StringBuilder out = new StringBuilder();
    for (ManifestFile m : manifests) {
      out.append(
          String.join(
              " ",
              m.path(),
              String.valueOf(m.length()),
              String.valueOf(m.partitionSpecId()),
              String.valueOf(m.content()),
              String.valueOf(m.sequenceNumber()),
              String.valueOf(m.minSequenceNumber()),
              String.valueOf(m.snapshotId()),
              String.valueOf(m.addedFilesCount()),
              String.valueOf(m.addedRowsCount()),
              String.valueOf(m.existingFilesCount()),
              String.valueOf(m.existingRowsCount()),
              String.valueOf(m.deletedFilesCount()),
              String.valueOf(m.deletedRowsCount()),
              String.valueOf(m.firstRowId()),
              hex(m.keyMetadata())));
      if (m.partitions() != null) {
        for (ManifestFile.PartitionFieldSummary p : m.partitions()) {
          out.append(" [")
              .append(p.containsNull())
              .append(' ')
              .append(p.containsNaN())
              .append(' ')
              .append(hex(p.lowerBound()))
              .append(' ')
              .append(hex(p.upperBound()))
              .append(']');
        }
      } else {
        out.append(" no-partitions");
      }
      out.append('\n');
    }
    return out.toString();
  }

  private static String hex(ByteBuffer bytes) {
    if (bytes == null) {
      return "-";
    }
    StringBuilder out = new StringBuilder("0x");
    ByteBuffer view = bytes.duplicate();
    while (view.hasRemaining()) {
      out.append(String.format("%02x", view.get()));
    }
    return out.toString();
  }

  // the manifests of a commit are read and written on its own thread: Iceberg's worker pool
  // has a thread per core for every commit thread, and a commit waiting for it polls every
  // 10 ms (Tasks.waitFor), which made a commit of one file take ~90 ms with 8 commit threads
  private static final ExecutorService IN_THIS_THREAD = MoreExecutors.newDirectExecutorService();

  // Parquet's reader options from a plain configuration: its default builder makes a new
  // Hadoop configuration for every file it opens (parsing Hadoop's default XML files), which
  // cost several times the footer's own read
  private static final ParquetReadOptions READ_OPTIONS =
      ParquetReadOptions.builder(new PlainParquetConfiguration()).build();

  /** The metrics of a local Parquet file from its footer, as ParquetUtil.fileMetrics gives. */
  private static Metrics localMetrics(
      java.nio.file.Path path, MetricsConfig config, NameMapping mapping) {
    try (ParquetFileReader reader = ParquetFileReader.open(new LocalInputFile(path), READ_OPTIONS)) {
      return ParquetUtil.footerMetrics(reader.getFooter(), Stream.empty(), config, mapping);
    } catch (IOException e) {
      throw new UncheckedIOException("cannot read the Parquet footer of " + path, e);
    }
  }

  private static Map<String, String> summary(
      Map<String, String> found,
      List<String> carriedPrefixes,
      Map<String, String> extra,
      Map<String, String> mark) {
    Map<String, String> out = new LinkedHashMap<>();
    for (Map.Entry<String, String> e : found.entrySet()) {
      for (String prefix : carriedPrefixes) {
        if (e.getKey().startsWith(prefix)) {
          out.put(e.getKey(), e.getValue());
          break;
        }
      }
    }
    out.putAll(extra);
    out.putAll(mark);
    return out;
  }

  private static Long number(Map<String, String> found, String key) {
    String value = found.get(key);
    return value == null ? null : Long.valueOf(value);
  }

  /**
   * A table's operations at the metadata last read or committed here: {@code current} and
   * {@code refresh} give it (never the catalog's newer one), and a commit on it writes the new
   * metadata file and keeps it as {@code pending} until Python has swapped the catalog's
   * pointer to it.
   */
  static final class Ops implements TableOperations {
    private static final Pattern VERSION = Pattern.compile("(\\d+)-[^/]*\\.metadata\\.json$");
    // the metadata file the last commit on this thread wrote
    static final ThreadLocal<String> WRITTEN = new ThreadLocal<>();
    private final FileIO io;
    volatile TableMetadata current;
    // a new table's metadata while it is created (current is null until Python inserted it)
    volatile TableMetadata creating;
    // written, not yet swapped in by Python, by location
    final Map<String, TableMetadata> pending = new ConcurrentHashMap<>();

    Ops(FileIO io, TableMetadata current) {
      this.io = io;
      this.current = current;
    }

    @Override
    public TableMetadata current() {
      return current;
    }

    @Override
    public TableMetadata refresh() {
      return current;
    }

    @Override
    public void commit(TableMetadata base, TableMetadata metadata) {
      if (base != current) {
        throw new CommitFailedException("Cannot commit: the table moved on since it was read");
      }
      String file =
          String.format(
              "%05d-%s%s",
              base == null ? 0 : version(base.metadataFileLocation()) + 1,
              UUID.randomUUID(),
              TableMetadataParser.getFileExtension(
                  metadata.property(
                      TableProperties.METADATA_COMPRESSION,
                      TableProperties.METADATA_COMPRESSION_DEFAULT)));
      String location = metadataFileLocation(metadata, file);
      TableMetadataParser.write(metadata, io.newOutputFile(location));
      pending.put(
          location,
          TableMetadata.buildFrom(metadata).discardChanges().withMetadataLocation(location).build());
      WRITTEN.set(location);
    }

    private static int version(String location) {
      Matcher found = location == null ? null : VERSION.matcher(location);
      return found != null && found.find() ? Integer.parseInt(found.group(1)) : 0;
    }

    private static String metadataFileLocation(TableMetadata metadata, String fileName) {
      String folder = metadata.properties().get(TableProperties.WRITE_METADATA_LOCATION);
      if (folder != null) {
        return folder.replaceAll("/+$", "") + "/" + fileName;
      }
      return metadata.location().replaceAll("/+$", "") + "/metadata/" + fileName;
    }

    @Override
    public FileIO io() {
      return io;
    }

    @Override
    public String metadataFileLocation(String fileName) {
      return metadataFileLocation(current != null ? current : creating, fileName);
    }

    @Override
    public LocationProvider locationProvider() {
      TableMetadata metadata = current != null ? current : creating;
      return LocationProviders.locationsFor(metadata.location(), metadata.properties());
    }
  }
}
