/*
 * S3A's file system, except that it remembers the size of the files a flush round's
 * tasks write into a table's folder (DirectPartitionCommitProtocol's reported files),
 * so that nobody asks the store for it afterwards.
 *
 * A round of 450 shapes on S3 asked for each file's status twice once it was written:
 * Spark's write statistics (BasicWriteTaskStatsTracker, a getFileStatus per file) and
 * the protocol's report (the size and time tidemark's commit gives each file). Each is
 * a HEAD request through S3A, inside the writing tasks: 900 requests a round, each a
 * round trip to the store. The size is known here without one: the bytes the task
 * wrote through the stream before closing it (the object's size once its upload
 * returns). The time is this machine's clock at the close (Delta's modificationTime:
 * the store's Last-Modified is the same moment, give or take the upload and the
 * clocks).
 *
 * Only the files the protocol registered (a write with `tidemark.direct.report`, into
 * a folder on an object store) are remembered, from their creation until the driver
 * takes the report (DirectPartitionCommitProtocol.take) or the task aborts; every
 * other path is S3A's as it is. A file created again (a task run again) forgets its
 * size until the new stream closes; an upload that failed leaves none.
 *
 * Such a file's upload is not waited for by its close: S3A's close makes the PUT and
 * waits for its reply, so each task of a round spent a request's latency per file it
 * wrote, one after the other. Here the close hands the upload to a pool (at most
 * UPLOADS_IN_FLIGHT at once: each holds its S3A block buffer), and the task goes on to
 * its next file; the task waits for every upload of its files before it commits
 * (DirectPartitionCommitProtocol.commitTask), so a failed upload fails the task, as a
 * failed close did, and no file is reported before its PUT has returned.
 *
 * Set as `fs.s3a.impl` by tidemark.spark.configure_s3a. Built into tidemark-jvm.jar by
 * `make jvm`; loaded only where S3A's jars are on the class path.
 */
package tidemark.hadoop;

import java.io.IOException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.Semaphore;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.fs.s3a.S3AFileSystem;
import org.apache.hadoop.util.Progressable;

public class SizedS3AFileSystem extends S3AFileSystem {
  /** Uploads of closed files not yet done, at most (each holds a 16 MiB block buffer). */
  static final int UPLOADS_IN_FLIGHT = 32;

  private static final Semaphore SLOTS = new Semaphore(UPLOADS_IN_FLIGHT);
  private static final ExecutorService UPLOADS =
      Executors.newCachedThreadPool(
          task -> {
            Thread thread = new Thread(task, "tidemark-s3a-upload");
            thread.setDaemon(true);
            return thread;
          });

  @Override
  public FSDataOutputStream create(
      Path path,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    String key = path.toString();
    boolean sized = DirectPartitionCommitProtocol.Sizes.creating(key);
    FSDataOutputStream s3a =
        super.create(path, permission, overwrite, bufferSize, replication, blockSize, progress);
    if (!sized) {
      return s3a;
    }
    return new FSDataOutputStream(s3a, null) {
      private boolean closed;

      @Override
      public void close() throws IOException {
        if (closed) {
          return;
        }
        closed = true;
        long size = getPos();
        SLOTS.acquireUninterruptibly();
        Future<?> upload;
        try {
          upload =
              UPLOADS.submit(
                  () -> {
                    try {
                      s3a.close(); // (S3A's: the PUT, and its reply)
                    } finally {
                      SLOTS.release();
                    }
                    return null;
                  });
        } catch (RuntimeException e) { // (not submitted)
          SLOTS.release();
          throw e;
        }
        DirectPartitionCommitProtocol.Sizes.closed(key, size, upload);
      }
    };
  }

  @Override
  public FileStatus getFileStatus(Path path) throws IOException {
    long[] known = DirectPartitionCommitProtocol.Sizes.written(path.toString());
    if (known == null) {
      return super.getFileStatus(path);
    }
    return new FileStatus(
        known[0], false, 1, getDefaultBlockSize(path), known[1], makeQualified(path));
  }
}
