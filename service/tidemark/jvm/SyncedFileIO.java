package tidemark.iceberg;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.hadoop.HadoopFileIO;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.io.PositionOutputStream;

/**
 * Iceberg's Hadoop file IO, except that each metadata file it writes on local disk is written
 * whole at its close: fenced there, then synced with its folder (as tidemark/sink/iceberg/io.py
 * does for pyiceberg). A commit's manifests, manifest list and table metadata are on disk
 * before the catalog's pointer moves to them, and a leader deposed while it encoded one (the
 * leader file names a newer epoch) leaves no file, not even a part of one. Deletions (of a
 * refused commit's manifests, of old metadata files) are skipped once deposed.
 */
public class SyncedFileIO extends HadoopFileIO {

  /** The fence of the commit running on this thread (IcebergStreamCommits.append sets it). */
  static final class Fence {
    private static final ThreadLocal<Fence> CURRENT = new ThreadLocal<>();
    private static final Pattern EPOCH = Pattern.compile("\"epoch\"\\s*:\\s*(\\d+)");
    final String leaderFile; // null or empty: unfenced
    final long epoch;
    final boolean sync;

    private Fence(String leaderFile, long epoch, boolean sync) {
      this.leaderFile = leaderFile;
      this.epoch = epoch;
      this.sync = sync;
    }

    static void set(String leaderFile, long epoch, boolean sync) {
      CURRENT.set(new Fence(leaderFile, epoch, sync));
    }

    static void clear() {
      CURRENT.remove();
    }

    static Fence current() {
      Fence fence = CURRENT.get();
      return fence == null ? new Fence(null, -1, true) : fence;
    }

    /** Throws {@link Deposed} when the leader file names an epoch newer than this one's. */
    void check() {
      if (leaderFile == null || leaderFile.isEmpty() || epoch < 0) {
        return;
      }
      String text;
      try {
        text = Files.readString(Path.of(leaderFile), StandardCharsets.UTF_8);
      } catch (NoSuchFileException gone) {
        return;
      } catch (IOException e) {
        throw new UncheckedIOException("cannot read the leader epoch at " + leaderFile, e);
      }
      Matcher found = EPOCH.matcher(text);
      if (found.find() && Long.parseLong(found.group(1)) > epoch) {
        throw new Deposed(
            "a newer leader (epoch "
                + found.group(1)
                + ") took over; this instance (epoch "
                + epoch
                + ") stops writing");
      }
    }

    boolean deposed() {
      try {
        check();
        return false;
      } catch (Deposed e) {
        return true;
      }
    }
  }

  /** A newer leader took over (tidemark.state.fencing.Deposed on the Python side). */
  public static final class Deposed extends RuntimeException {
    Deposed(String message) {
      super(message);
    }
  }

  @Override
  public OutputFile newOutputFile(String location) {
    Path local = localPath(location);
    return local == null ? super.newOutputFile(location) : new WholeAtClose(location, local, this);
  }

  @Override
  public void deleteFile(String location) {
    if (!Fence.current().deposed()) {
      super.deleteFile(location);
    }
  }

  /**
   * One by one on this thread, fenced: Hadoop's file IO deletes a batch on its worker pool
   * and polls for it every 10 ms (the old metadata files a commit no longer keeps: one or
   * two).
   */
  @Override
  public void deleteFiles(Iterable<String> locations) {
    if (Fence.current().deposed()) {
      return;
    }
    for (String location : locations) {
      super.deleteFile(location);
    }
  }

  static Path localPath(String location) {
    if (location.startsWith("file:")) {
      return Path.of(URI.create(location.startsWith("file:///") ? location : "file://" + location.substring(5)));
    }
    return location.startsWith("/") ? Path.of(location) : null;
  }

  static void fsync(Path path) throws IOException {
    try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
      channel.force(true);
    }
  }

  /** A local output file written whole when its stream closes. */
  static final class WholeAtClose implements OutputFile {
    private final String location;
    private final Path path;
    private final SyncedFileIO io;

    WholeAtClose(String location, Path path, SyncedFileIO io) {
      this.location = location;
      this.path = path;
      this.io = io;
    }

    @Override
    public PositionOutputStream create() {
      Fence.current().check(); // (a deposed leader does not even start encoding)
      if (Files.exists(path)) {
        throw new AlreadyExistsException("Cannot create file, already exists: %s", location);
      }
      return new Buffered(path, false);
    }

    @Override
    public PositionOutputStream createOrOverwrite() {
      Fence.current().check();
      return new Buffered(path, true);
    }

    @Override
    public String location() {
      return location;
    }

    @Override
    public InputFile toInputFile() {
      return io.newInputFile(location);
    }
  }

  static final class Buffered extends PositionOutputStream {
    private final Path path;
    private final boolean overwrite;
    private final Fence fence = Fence.current();
    private ByteArrayOutputStream buffer = new ByteArrayOutputStream(8 * 1024);
    // the file's length once closed: Iceberg's writers ask for it after the close (a
    // manifest's length in the manifest list), where 0 was given before
    private long written;

    Buffered(Path path, boolean overwrite) {
      this.path = path;
      this.overwrite = overwrite;
    }

    @Override
    public long getPos() {
      return buffer == null ? written : buffer.size();
    }

    @Override
    public void write(int b) {
      buffer.write(b);
    }

    @Override
    public void write(byte[] b, int off, int len) {
      buffer.write(b, off, len);
    }

    @Override
    public void close() throws IOException {
      if (buffer == null) {
        return;
      }
      byte[] data = buffer.toByteArray();
      buffer = null;
      written = data.length;
      fence.check();
      Files.createDirectories(path.getParent());
      StandardOpenOption[] options =
          overwrite
              ? new StandardOpenOption[] {
                StandardOpenOption.WRITE, StandardOpenOption.CREATE, StandardOpenOption.TRUNCATE_EXISTING
              }
              : new StandardOpenOption[] {StandardOpenOption.WRITE, StandardOpenOption.CREATE_NEW};
      try (FileChannel channel = FileChannel.open(path, options)) {
        ByteBuffer bytes = ByteBuffer.wrap(data);
        while (bytes.hasRemaining()) {
          channel.write(bytes);
        }
        if (fence.sync) {
          channel.force(true);
        }
      } catch (FileAlreadyExistsException e) {
        throw new AlreadyExistsException("Cannot create file, already exists: %s", path);
      }
      if (fence.sync) {
        fsync(path.getParent());
      }
    }
  }
}
