/*
 * Spark's commit protocol, except for one partition column: a flush round's rows are
 * partitioned by `_tm_dest`, each member's value being the folder of its own table the
 * member's files go to, and a task writes those files there directly.
 *
 * With the standard protocol each member's folder is made under the job's
 * `_temporary` tree, renamed into the output folder when the job commits, and renamed
 * again by tidemark into its table: three directory changes per shape per round, at
 * 0.1-0.5 ms each on the disks measured. Written in place, a member costs the folder
 * and the file Spark creates for it. Nothing is committed by this: the files become
 * part of a table only with the Delta commit tidemark makes after the job, and files
 * of a failed job are never committed (vacuum removes them), as with the files the
 * standard protocol would have left.
 *
 * Every other write (no `_tm_dest` column) is the standard protocol's. Used in local
 * mode only (tidemark.spark.local_mode_conf). A file's name is the task's split and
 * the job's id, so a task run again (local[N,F]) writes the same names: never a second
 * copy of a shape's rows next to what a failed attempt left.
 *
 * On an object store, for a write with the option `tidemark.direct.report` (tidemark's
 * writes into a table's folder there), a task also reports each file it wrote into a
 * member's folder, with the size and time the store gives it, once the task commits;
 * tidemark takes the report after the job (`take`, also after a failed one) and
 * describes the files without listing each member's folder (a request and its Python
 * per shape: 1.2-1.75 s of a round of 450 shapes on S3). In local mode the tasks run
 * in the driver's JVM, so a static table carries the report to the driver. A task
 * commits only once the uploads its files' closes started have returned
 * (SizedS3AFileSystem uploads beside the task): a failed one fails the task.
 *
 * Built into tidemark-jvm.jar next to this file by `make jvm`.
 */
package tidemark.hadoop;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.spark.internal.io.FileCommitProtocol;
import org.apache.spark.internal.io.FileNameSpec;
import org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol;
import scala.Option;

public class DirectPartitionCommitProtocol extends SQLHadoopMapReduceCommitProtocol {
  public static final String COLUMN = "_tm_dest";
  /** A write's option: its tasks report the files they write on an object store. */
  public static final String REPORT = "tidemark.direct.report";
  private static final String PREFIX = COLUMN + "=";

  public DirectPartitionCommitProtocol(
      String jobId, String path, boolean dynamicPartitionOverwrite) {
    super(jobId, path, dynamicPartitionOverwrite);
  }

  /** Per folder on an object store: each file's name, size and modification time. */
  private static final Map<String, Map<String, long[]>> WRITTEN = new ConcurrentHashMap<>();

  /** This task's files in folders on an object store (the protocol is a task's own copy). */
  private transient List<String[]> taskFiles;

  @Override
  public String newTaskTempFile(
      TaskAttemptContext taskContext, Option<String> dir, FileNameSpec spec) {
    if (dir.isDefined() && dir.get().startsWith(PREFIX) && dir.get().indexOf('/') < 0) {
      String folder = unescape(dir.get().substring(PREFIX.length()));
      String name = getFilename(taskContext, spec);
      if (remote(folder) && taskContext.getConfiguration().getBoolean(REPORT, false)) {
        if (taskFiles == null) {
          taskFiles = new ArrayList<>();
        }
        taskFiles.add(new String[] {folder, name});
        String path = new Path(folder, name).toString();
        Sizes.expect(path);
        return path;
      }
      return new Path(folder, name).toString();
    }
    return super.newTaskTempFile(taskContext, dir, spec);
  }

  @Override
  public FileCommitProtocol.TaskCommitMessage commitTask(TaskAttemptContext taskContext) {
    if (taskFiles != null) {
      try { // every upload of the task's files returned (SizedS3AFileSystem's closes)
        for (String[] file : taskFiles) {
          Sizes.uploaded(new Path(file[0], file[1]).toString());
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
    FileCommitProtocol.TaskCommitMessage message = super.commitTask(taskContext);
    if (taskFiles != null) {
      try {
        for (String[] file : taskFiles) {
          Path path = new Path(file[0], file[1]);
          long[] written = Sizes.written(path.toString());
          if (written == null) { // (S3A's own file system: ask the store)
            FileStatus status =
                path.getFileSystem(taskContext.getConfiguration()).getFileStatus(path);
            written = new long[] {status.getLen(), status.getModificationTime()};
          }
          WRITTEN.computeIfAbsent(file[0], k -> new ConcurrentHashMap<>()).put(file[1], written);
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      } finally {
        taskFiles = null;
      }
    }
    return message;
  }

  @Override
  public void abortTask(TaskAttemptContext taskContext) {
    try {
      super.abortTask(taskContext);
    } finally {
      if (taskFiles != null) {
        for (String[] file : taskFiles) {
          String path = new Path(file[0], file[1]).toString();
          try { // (no upload of this attempt lands after a next attempt's)
            Sizes.uploaded(path);
          } catch (IOException e) {
            // the attempt failed anyway
          }
          Sizes.forget(path);
        }
        taskFiles = null;
      }
    }
  }

  /**
   * What the committed tasks wrote into the given folders (one per line), forgotten
   * here: a line per file, "folder TAB name TAB size TAB modified-ms"; a folder with
   * no line had no file reported (the caller lists it).
   */
  public static String take(String folders) {
    StringBuilder out = new StringBuilder();
    for (String folder : folders.split("\n")) {
      Map<String, long[]> files = WRITTEN.remove(folder);
      if (files == null) {
        continue;
      }
      for (Map.Entry<String, long[]> file : files.entrySet()) {
        Sizes.forget(new Path(folder, file.getKey()).toString());
        out.append(folder).append('\t').append(file.getKey()).append('\t');
        out.append(file.getValue()[0]).append('\t').append(file.getValue()[1]).append('\n');
      }
    }
    return out.toString();
  }

  /**
   * The sizes of the files the tasks of a reporting write create, as SizedS3AFileSystem
   * (S3A's file system, when it is the session's) sees them written: kept from the file's
   * creation until the report is taken or the task aborts, so that neither Spark's write
   * statistics nor the report ask the store for them. (Here, not in that class: this one
   * is loaded without S3A's jars.)
   */
  static final class Sizes {
    private static final long[] UNKNOWN = new long[0];
    private static final Map<String, long[]> SIZES = new ConcurrentHashMap<>();
    private static final Map<String, Future<?>> UPLOADS = new ConcurrentHashMap<>();

    private Sizes() {}

    static void expect(String path) {
      SIZES.put(path, UNKNOWN);
    }

    /** A stream is created for {@code path}: whether its size is to be kept at its close. */
    static boolean creating(String path) {
      return SIZES.replace(path, UNKNOWN) != null;
    }

    /** Its stream closed after {@code size} bytes; {@code upload} completes its PUT. */
    static void closed(String path, long size, Future<?> upload) {
      UPLOADS.put(path, upload);
      SIZES.computeIfPresent(path, (k, v) -> new long[] {size, System.currentTimeMillis()});
    }

    /** Waits until the upload of {@code path} started at its close returned; its failure. */
    static void uploaded(String path) throws IOException {
      Future<?> upload = UPLOADS.remove(path);
      if (upload == null) {
        return;
      }
      try {
        upload.get();
      } catch (ExecutionException e) {
        SIZES.remove(path);
        Throwable cause = e.getCause();
        throw cause instanceof IOException io ? io : new IOException(cause);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new InterruptedIOException("waiting for the upload of " + path);
      }
    }

    /** {size, modified-ms} of {@code path} as written, or null. */
    static long[] written(String path) {
      long[] found = SIZES.get(path);
      return found == null || found.length == 0 ? null : found;
    }

    static void forget(String path) {
      SIZES.remove(path);
      UPLOADS.remove(path);
    }
  }

  /** Whether a member's folder is on an object store (not on this machine's disks). */
  static boolean remote(String folder) {
    int colon = folder.indexOf(':');
    return colon > 0 && !folder.startsWith("file:") && folder.indexOf('/') > colon;
  }

  /** A partition value as Spark escaped it into a path segment: %XX back to chars. */
  static String unescape(String escaped) {
    StringBuilder out = new StringBuilder(escaped.length());
    int i = 0;
    while (i < escaped.length()) {
      char c = escaped.charAt(i);
      if (c == '%' && isHex(escaped, i + 1)) {
        out.append((char) Integer.parseInt(escaped.substring(i + 1, i + 3), 16));
        i += 3;
      } else {
        out.append(c);
        i += 1;
      }
    }
    return out.toString();
  }

  private static boolean isHex(String s, int at) {
    return at + 1 < s.length()
        && Character.digit(s.charAt(at), 16) >= 0
        && Character.digit(s.charAt(at + 1), 16) >= 0;
  }
}
