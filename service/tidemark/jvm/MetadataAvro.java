package tidemark.iceberg;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Function;
import java.util.zip.Deflater;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.InternalData;
import org.apache.iceberg.Metrics;
import org.apache.iceberg.Schema;
import org.apache.iceberg.SchemaParser;
import org.apache.iceberg.avro.AvroSchemaUtil;
import org.apache.iceberg.avro.InternalWriter;
import org.apache.iceberg.io.FileAppender;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.io.PositionOutputStream;
import org.apache.iceberg.types.Types;

/**
 * Iceberg's metadata Avro files (a commit's manifest and manifest list) written by Iceberg's own
 * record writers into Avro's object container format, with the schema work done once per schema
 * instead of once per file.
 *
 * <p>Iceberg writes those files through {@code InternalData.write(AVRO, file)}, whose builder
 * converts the Iceberg schema to Avro's, prints both as JSON into the file's header and makes a
 * new deflater at every file. A stream commit writes two such files of the same two schemas
 * (a table's manifest entries, the manifest list's entries): most of its writers' set-up in JFR's
 * samples, ~0.15 ms of a 3-4 ms commit when warm (a harness: 261-305 us -> 120-156 us). Here the
 * converted schema and both JSON texts are kept by schema (their equality: the struct, its id
 * and identifier fields, the record's name) and each thread keeps its deflater; the header,
 * blocks and sync marker are Avro's container format, the codec Iceberg's default for these files
 * (deflate, level 9), the records encoded by Iceberg's {@link InternalWriter} as before.
 *
 * <p>{@link #install} replaces the AVRO entry of {@code InternalData}'s write builders (a private
 * map: no public way in); a builder given a write property (a codec, a level) hands everything
 * to Iceberg's own builder, as does every format but Avro.
 */
final class MetadataAvro {
  private static final byte[] MAGIC = {'O', 'b', 'j', 1};
  private static final int SYNC_SIZE = 16;
  // Avro's default block size (DataFileConstants.DEFAULT_SYNC_INTERVAL)
  private static final int BLOCK_BYTES = 64000;
  private static final int DEFLATE_LEVEL = 9;
  private static final Map<Key, Shape> SHAPES = new ConcurrentHashMap<>();
  private static final ThreadLocal<Deflater> DEFLATERS =
      ThreadLocal.withInitial(() -> new Deflater(DEFLATE_LEVEL, true));
  private static volatile boolean installed;

  private MetadataAvro() {}

  /** Make {@code InternalData.write(AVRO, ...)} give this class's builder (once a JVM). */
  static synchronized void install() {
    if (installed) {
      return;
    }
    try {
      Field field = InternalData.class.getDeclaredField("WRITE_BUILDERS");
      field.setAccessible(true);
      @SuppressWarnings("unchecked")
      Map<FileFormat, Function<OutputFile, InternalData.WriteBuilder>> builders =
          (Map<FileFormat, Function<OutputFile, InternalData.WriteBuilder>>) field.get(null);
      Function<OutputFile, InternalData.WriteBuilder> iceberg = builders.get(FileFormat.AVRO);
      if (iceberg == null) {
        return;
      }
      builders.put(FileFormat.AVRO, file -> new Builder(file, iceberg));
      installed = true;
    } catch (ReflectiveOperationException | RuntimeException e) {
      // (another Iceberg than the one built against: its own writers stay, slower, as correct)
      org.slf4j.LoggerFactory.getLogger(MetadataAvro.class)
          .warn("Iceberg's Avro metadata writers stay as they are: {}", e.toString());
    }
  }

  /** What a schema's files share: the Avro schema and the two JSON texts of their header. */
  private static final class Shape {
    final org.apache.avro.Schema avro;
    final byte[] avroJson;
    final byte[] icebergJson;

    Shape(Schema schema, String name) {
      this.avro = AvroSchemaUtil.convert(schema, name);
      this.avroJson = avro.toString().getBytes(StandardCharsets.UTF_8);
      this.icebergJson = SchemaParser.toJson(schema).getBytes(StandardCharsets.UTF_8);
    }
  }

  private record Key(String name, int schemaId, Types.StructType struct, Set<Integer> ids) {
    static Key of(Schema schema, String name) {
      return new Key(name, schema.schemaId(), schema.asStruct(), schema.identifierFieldIds());
    }
  }

  /** Iceberg's builder's calls, kept; built here, or replayed on Iceberg's own builder. */
  private static final class Builder implements InternalData.WriteBuilder {
    private final OutputFile file;
    private final Function<OutputFile, InternalData.WriteBuilder> iceberg;
    private final Map<String, String> config = new HashMap<>();
    private final Map<String, String> meta = new LinkedHashMap<>();
    private Schema schema;
    private String name = "table";
    private boolean overwrite;

    Builder(OutputFile file, Function<OutputFile, InternalData.WriteBuilder> iceberg) {
      this.file = file;
      this.iceberg = iceberg;
    }

    @Override
    public InternalData.WriteBuilder schema(Schema newSchema) {
      this.schema = newSchema;
      return this;
    }

    @Override
    public InternalData.WriteBuilder named(String newName) {
      this.name = newName;
      return this;
    }

    @Override
    public InternalData.WriteBuilder set(String property, String value) {
      config.put(property, value);
      return this;
    }

    @Override
    public InternalData.WriteBuilder meta(String property, String value) {
      meta.put(property, value);
      return this;
    }

    @Override
    public InternalData.WriteBuilder overwrite() {
      this.overwrite = true;
      return this;
    }

    @Override
    public <D> FileAppender<D> build() throws IOException {
      if (!config.isEmpty() || schema == null || name == null) {
        InternalData.WriteBuilder theirs = iceberg.apply(file);
        if (schema != null) {
          theirs.schema(schema);
        }
        theirs.named(name);
        config.forEach(theirs::set);
        meta.forEach(theirs::meta);
        if (overwrite) {
          theirs.overwrite();
        }
        return theirs.build();
      }
      Shape shape = SHAPES.computeIfAbsent(Key.of(schema, name), k -> new Shape(schema, name));
      return new Appender<>(overwrite ? file.createOrOverwrite() : file.create(), shape, meta);
    }
  }

  /** One file: its header at once, then blocks of records, each deflated, each synced. */
  private static final class Appender<D> implements FileAppender<D> {
    private final PositionOutputStream out;
    private final InternalWriter<D> records;
    private final byte[] sync = new byte[SYNC_SIZE];
    private final ByteArrayOutputStream block = new ByteArrayOutputStream(4096);
    private final BinaryEncoder encoder;
    private long count;
    private long inBlock;
    private boolean closed;

    Appender(PositionOutputStream out, Shape shape, Map<String, String> meta) throws IOException {
      this.out = out;
      this.records = InternalWriter.create(shape.avro);
      this.encoder = EncoderFactory.get().directBinaryEncoder(block, null);
      ThreadLocalRandom.current().nextBytes(sync);
      Map<String, byte[]> header = new LinkedHashMap<>();
      meta.forEach((key, value) -> header.put(key, value.getBytes(StandardCharsets.UTF_8)));
      header.put("iceberg.schema", shape.icebergJson);
      header.put("avro.schema", shape.avroJson);
      header.put("avro.codec", "deflate".getBytes(StandardCharsets.UTF_8));
      encoder.writeFixed(MAGIC);
      encoder.writeMapStart();
      encoder.setItemCount(header.size());
      for (Map.Entry<String, byte[]> entry : header.entrySet()) {
        encoder.startItem();
        encoder.writeString(entry.getKey());
        encoder.writeBytes(entry.getValue());
      }
      encoder.writeMapEnd();
      encoder.writeFixed(sync);
      block.writeTo(out);
      block.reset();
    }

    @Override
    public void add(D datum) {
      try {
        records.write(datum, encoder);
        count += 1;
        inBlock += 1;
        if (block.size() >= BLOCK_BYTES) {
          writeBlock();
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    private void writeBlock() throws IOException {
      if (inBlock == 0) {
        return;
      }
      byte[] deflated = deflate(block.toByteArray());
      block.reset();
      encoder.writeLong(inBlock);
      encoder.writeLong(deflated.length);
      block.writeTo(out);
      block.reset();
      out.write(deflated);
      out.write(sync);
      inBlock = 0;
    }

    private static byte[] deflate(byte[] raw) {
      Deflater deflater = DEFLATERS.get();
      deflater.reset();
      deflater.setInput(raw);
      deflater.finish();
      ByteArrayOutputStream deflated = new ByteArrayOutputStream(Math.max(64, raw.length / 2));
      byte[] buffer = new byte[Math.max(1024, Math.min(raw.length, 65536))];
      while (!deflater.finished()) {
        int n = deflater.deflate(buffer);
        deflated.write(buffer, 0, n);
      }
      return deflated.toByteArray();
    }

    @Override
    public Metrics metrics() {
      if (!closed) {
        throw new IllegalStateException("Cannot return metrics while appending to an open file.");
      }
      return new Metrics(count, null, null, null, null);
    }

    @Override
    public long length() {
      try {
        return out.storedLength();
      } catch (IOException e) {
        throw new UncheckedIOException("Failed to get stream length", e);
      }
    }

    @Override
    public List<Long> splitOffsets() {
      return null;
    }

    @Override
    public void close() throws IOException {
      if (!closed) {
        writeBlock();
        out.close();
        closed = true;
      }
    }
  }
}
